"""What the kernels run on: device name, architecture and limits the constraints need."""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass


def interpreter_active() -> bool:
    """True when Triton kernels run through the CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@dataclass(frozen=True)
class DeviceInfo:
    name: str  # e.g. "NVIDIA H200"; "cpu-interpreter" when no GPU is used
    arch: str  # e.g. "sm_90"; "interpreter" on the CPU
    sm_count: int
    max_shared_mem: int  # bytes one program may use (opt-in limit)
    l2_bytes: int
    is_gpu: bool

    @property
    def capability(self) -> tuple[int, int] | None:
        return arch_capability(self.arch)

    @property
    def slug(self) -> str:
        """File-name-safe device name ("NVIDIA H200" -> "nvidia_h200")."""
        return safe_name(self.name)


def arch_capability(arch: str) -> tuple[int, int] | None:
    """"sm_90" -> (9, 0); None for "interpreter" and other non-CUDA archs."""
    m = re.fullmatch(r"sm_(\d+)(\d)", arch)
    return (int(m.group(1)), int(m.group(2))) if m else None


def safe_name(name: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")
    if not slug:
        raise ValueError(f"device name {name!r} has no usable characters")
    return slug


INTERPRETER = DeviceInfo(
    name="cpu-interpreter", arch="interpreter", sm_count=1, max_shared_mem=227 * 1024,
    l2_bytes=0, is_gpu=False,
)


@functools.cache
def device_info(index: int | None = None) -> DeviceInfo:
    """The CUDA device `index` (current one if None), or the interpreter pseudo-device."""
    import torch

    if interpreter_active() or not torch.cuda.is_available():
        return INTERPRETER
    if index is None:
        index = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    smem = getattr(props, "shared_memory_per_block_optin", 0) or 48 * 1024
    return DeviceInfo(
        name=props.name,
        arch=f"sm_{props.major}{props.minor}",
        sm_count=props.multi_processor_count,
        max_shared_mem=int(smem),
        l2_bytes=int(getattr(props, "L2_cache_size", 0)),
        is_gpu=True,
    )


def kernel_device() -> str:
    """torch device string kernels should allocate on: "cuda" or "cpu" (interpreter)."""
    return "cpu" if device_info().arch == "interpreter" else "cuda"
