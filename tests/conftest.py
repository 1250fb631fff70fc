"""CPU suite: every Triton kernel runs through the interpreter.

TRITON_INTERPRET must be set before triton is first imported, which is why it
is done here at module import, before any test module pulls in moetune.
"""

import os

import pytest

if not os.environ.get("MOETUNE_TEST_GPU"):
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available() and os.environ.get("MOETUNE_TEST_GPU"):
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (set MOETUNE_TEST_GPU=1 on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def device():
    """Where kernels run in this suite: the GPU when asked for, else the CPU interpreter."""
    return "cuda" if os.environ.get("MOETUNE_TEST_GPU") else "cpu"
