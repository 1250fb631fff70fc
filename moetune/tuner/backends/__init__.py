"""Measuring backends behind one interface (:mod:`moetune.tuner.backends.base`): worker processes on
this host (``process``: the plain runner; ``local``: one measuring worker per GPU) or Ray actors (``ray``)."""
