"""CPU suite: every Triton kernel runs through the interpreter.

TRITON_INTERPRET must be set before triton is first imported, which is why it
is done here at module import, before any test module pulls in moetune.
"""

import os

import pytest

if not os.environ.get("MOETUNE_TEST_GPU"):
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

# Where kernels run in this suite: the GPU when asked for, else the CPU interpreter. Module-level
# helpers that build tensors outside a test (shared layer builders, module-scoped fixtures) import it.
DEVICE = "cuda" if os.environ.get("MOETUNE_TEST_GPU") else "cpu"


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "interpreter: checks the Triton interpreter itself (skipped on the GPU)"
    )


def pytest_collection_modifyitems(config, items):
    if DEVICE == "cuda":
        skip = pytest.mark.skip(reason="checks the Triton interpreter (runs without MOETUNE_TEST_GPU)")
        for item in items:
            if "interpreter" in item.keywords:
                item.add_marker(skip)
        if torch.cuda.is_available():
            return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (set MOETUNE_TEST_GPU=1 on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def device():
    """Where kernels run in this suite: the GPU when asked for, else the CPU interpreter."""
    return DEVICE
