"""Built-in kernel specs. Every module here is imported by the registry and calls ``spec.register``."""
