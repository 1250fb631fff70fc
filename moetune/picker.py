"""The tile picker: which config a kernel launch uses when the caller gives none.

Interim version: every call answers with the kernel spec's heuristic. The
table lookup (MOETUNE_CONFIG_DIR, packaged configs/, device then arch) lands next.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .device import DeviceInfo, device_info
from .spec import get_spec


def pick_config(kernel: str, shape: Mapping[str, Any], routes: int, *,
                device: DeviceInfo | str | None = None) -> dict[str, Any]:
    """The config for ``kernel`` at ``shape`` with ``routes`` routed rows on ``device``."""
    spec = get_spec(kernel)
    norm = spec.normalize_shape(shape)
    if isinstance(device, DeviceInfo):
        arch = device.arch
    elif device is None:
        arch = device_info().arch
    else:
        cur = device_info()
        arch = cur.arch if cur.name == device else "unknown"
    return dict(spec.heuristic(norm, int(routes), arch))
