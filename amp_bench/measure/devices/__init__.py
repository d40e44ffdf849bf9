"""The per-device seam: everything run_case does differently on a CPU and on a CUDA GPU, behind one
object. `for_device(torch_device)` picks it by the device's type; a new backend (ROCm, XPU) is one
module here holding a `DeviceOps` subclass, and one line in `_KINDS`. Nothing here imports torch at
module level: the classes import it inside their methods."""
from __future__ import annotations

from amp_bench.measure.devices.base import DeviceOps

_KINDS = {  # device type -> "module:class" in this package, imported when first asked for
    "cpu": "cpu:CpuOps",
    "cuda": "cuda:CudaOps",
}


def kind_of(torch_device) -> str:
    """'cuda' for torch.device('cuda', 1), 'cuda:1', 'cuda' or a DeviceInfo of type cuda."""
    kind = getattr(torch_device, "type", None)
    return kind if isinstance(kind, str) else str(torch_device).split(":", 1)[0]


def ops_class(kind: str) -> type[DeviceOps]:
    import importlib
    if kind not in _KINDS:
        raise ValueError(f"no device seam for {kind!r} (known: {', '.join(_KINDS)}): "
                         f"add amp_bench/measure/devices/{kind}.py")
    module, name = _KINDS[kind].split(":")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def for_device(torch_device, **seams) -> DeviceOps:
    """The DeviceOps for a torch.device (or 'cuda:0', 'cpu'). `seams` replace the library calls a
    class makes (CudaOps(cuda=...)), so tests drive the logic with fakes."""
    return ops_class(kind_of(torch_device))(torch_device, **seams)


__all__ = ["DeviceOps", "for_device", "kind_of", "ops_class"]
