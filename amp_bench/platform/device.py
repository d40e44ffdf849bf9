"""What device a case runs on and which precision modes that hardware really supports.

CUDA queries go through a small seam (`CudaQuery`) so the gating logic is tested on a CPU-only
machine with fakes that replay real GPUs' answers. The probe runs inside a worker process, never in
the orchestrating parent, so the parent never creates a CUDA context.
"""
from __future__ import annotations

import contextlib
import os
import platform
from dataclasses import asdict, dataclass, field

from amp_bench import modes
from amp_bench.platform.gpu_specs import architecture


@dataclass(frozen=True)
class DeviceInfo:
    type: str  # "cpu" or "cuda"
    name: str
    index: int | None = None
    capability: tuple[int, int] | None = None
    total_memory_bytes: int | None = None
    cpu_model: str = ""
    cpu_flags: frozenset[str] = field(default_factory=frozenset)
    cpu_fp16_autocast: bool = False  # does this torch's CPU autocast engage for float16?
    uuid: str = ""  # the GPU's UUID as NVML writes it (GPU-...), from torch: known without NVML

    @property
    def torch_device(self) -> str:
        return "cpu" if self.type == "cpu" else f"cuda:{self.index or 0}"

    @property
    def architecture(self) -> str:
        return "CPU" if self.type == "cpu" else architecture(self.capability or (0, 0))

    @property
    def label(self) -> str:
        """Short device name for run ids: 'cpu' or e.g. 'nvidia-h200'."""
        if self.type == "cpu":
            return "cpu"
        return "".join(c if c.isalnum() else "-" for c in self.name.lower()).strip("-") or "cuda"

    def to_json(self) -> dict:
        data = asdict(self)
        data["cpu_flags"] = sorted(self.cpu_flags)
        data["capability"] = list(self.capability) if self.capability else None
        return data

    @classmethod
    def from_json(cls, data: dict) -> DeviceInfo:
        data = dict(data)
        data["cpu_flags"] = frozenset(data.get("cpu_flags") or ())
        data["capability"] = tuple(data["capability"]) if data.get("capability") else None
        return cls(**data)


@dataclass(frozen=True)
class Support:
    """The gate's answer. One rule for emulation, on CPUs and GPUs alike: a mode the hardware only
    emulates (bf16/fp16 on a CPU without the ISA, bf16 below Ampere, fp16 below Volta) is not run
    unless the suite says allow_emulated, and when it runs, `reason` says why it is emulated."""
    supported: bool
    reason: str = ""
    emulated: bool = False  # runs, but without native hardware for this dtype


def precision_support(mode: str, device: DeviceInfo) -> Support:
    """Hardware gate per mode, from the mode's requirements in amp_bench.modes. Deliberately not
    torch.cuda.is_bf16_supported(): it counts slow emulation on Volta/Turing as support."""
    spec = modes.get(mode)
    missing = package_problem(spec)
    if missing:
        return Support(False, missing)
    if device.type == "cuda":
        cc = device.capability or (0, 0)
        if cc >= spec.cuda_min_capability:
            return Support(True)
        return Support(False, f"{spec.cuda_requirement}; {device.name} has compute capability {cc[0]}.{cc[1]}",
                       emulated=spec.cuda_below == "emulated")
    if spec.cpu == "always":
        return Support(True)
    if spec.cpu == "never":
        return Support(False, spec.cpu_requirement)
    if spec.cpu == "emulated":
        return Support(False, spec.cpu_requirement, emulated=True)
    if spec.autocast_dtype == "float16" and not device.cpu_fp16_autocast:
        return Support(False, "this torch's CPU autocast does not support float16")
    if device.cpu_flags & set(spec.cpu_isa_flags):
        return Support(True)
    return Support(False, spec.cpu_requirement, emulated=True)


def package_problem(spec: modes.Mode) -> str:
    """Why the optional package a mode needs is not usable here ('' when it is), without importing it."""
    if not spec.package:
        return ""
    import importlib.metadata
    import importlib.util
    if importlib.util.find_spec(spec.package) is None:
        return f"{spec.package} is not installed ({spec.package_hint})"
    lowest, first_unsupported = spec.package_versions
    try:
        version = importlib.metadata.version(spec.package)
    except importlib.metadata.PackageNotFoundError:
        return ""  # importable but not installed as a distribution (a source checkout): trust it
    if lowest and _release(version) < _release(lowest) or first_unsupported and \
            _release(version) >= _release(first_unsupported):
        return f"{spec.package} {version} is installed; this mode is tested with >={lowest},<{first_unsupported} " \
               f"({spec.package_hint})"
    return ""


def _release(version: str) -> tuple[int, ...]:
    """'0.18.0+cu130' -> (0, 18, 0), '0.19.0rc1' -> (0, 19, 0): the release numbers, to compare with a pin."""
    import re
    match = re.match(r"\d+(\.\d+)*", version.strip())
    return tuple(int(p) for p in match.group(0).split(".")) if match else ()


def may_run(support: Support, allow_emulated: bool) -> bool:
    return support.supported or (allow_emulated and support.emulated)


def not_run_reason(support: Support) -> str:
    """What a row that the gate stopped says."""
    if support.emulated:
        return f"{support.reason} (not run: allow_emulated: true or --allow-emulated measures it)"
    return support.reason


# oneDNN ISA levels (ONEDNN_MAX_CPU_ISA) below which the CPU's bf16 / fp16 instructions are not used:
# capping the ISA there makes bf16 autocast run emulated, so the gate must see it too.
_ONEDNN_NO_BF16 = {"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI"}
_ONEDNN_NO_FP16 = _ONEDNN_NO_BF16 | {"AVX512_CORE_BF16"}
_ONEDNN_NO_AMX = _ONEDNN_NO_FP16 | {"AVX512_CORE_FP16"}


def effective_cpu_flags(flags: frozenset[str], max_isa: str | None = None) -> frozenset[str]:
    """The CPU's flags as oneDNN will use them: ONEDNN_MAX_CPU_ISA hides what is above the cap."""
    cap = (max_isa if max_isa is not None else os.environ.get("ONEDNN_MAX_CPU_ISA", "")).strip().upper()
    hidden = set()
    if cap in _ONEDNN_NO_AMX:
        hidden |= {f for f in flags if f.startswith("amx")}
    if cap in _ONEDNN_NO_FP16:
        hidden |= {"avx512_fp16"}
    if cap in _ONEDNN_NO_BF16:
        hidden |= {"avx512_bf16"}
    return frozenset(flags - hidden)


class CudaQuery:
    """The few torch.cuda calls the probe needs; replaced by a fake in tests."""

    def is_available(self) -> bool:
        import torch
        return torch.cuda.is_available()

    def device_count(self) -> int:
        import torch
        return torch.cuda.device_count()

    def properties(self, index: int) -> tuple[str, tuple[int, int], int]:
        import torch
        props = torch.cuda.get_device_properties(index)
        return props.name, (props.major, props.minor), props.total_memory

    def uuid(self, index: int) -> str:
        """The device's UUID in NVML's form ("GPU-..."): torch gives it bare; '' where it has none."""
        import torch
        return nvml_uuid(str(getattr(torch.cuda.get_device_properties(index), "uuid", "") or ""))


def nvml_uuid(bare: str) -> str:
    """A UUID as NVML and nvidia-smi write it: torch's `props.uuid` has no "GPU-" prefix."""
    return bare if not bare or bare.startswith(("GPU-", "MIG-")) else f"GPU-{bare}"


def read_cpu_info(path: str = "/proc/cpuinfo") -> tuple[str, frozenset[str]]:
    """CPU model name and ISA flags (the first processor's; they are the same on all)."""
    model, flags = "", None
    with contextlib.suppress(OSError), open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "model name" and not model:
                model = value.strip()
            elif key in ("flags", "Features") and flags is None:
                flags = frozenset(value.split())
            if model and flags is not None:
                break
    return model or platform.processor() or platform.machine(), flags or frozenset()


def cpu_fp16_autocast_works() -> bool:
    """Does CPU autocast engage for float16 in this torch build? (It silently disables itself where it
    does not.) The same proof the worker runs before measuring (measure.precision.autocast_engages),
    asked here of the platform without importing the measuring layer."""
    import warnings

    import torch
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            with torch.autocast("cpu", dtype=torch.float16):
                out = torch.nn.functional.linear(torch.ones(2, 2), torch.ones(2, 2))
        except Exception:  # an unsupported combination may raise instead
            return False
    return out.dtype == torch.float16


class DeviceUnavailable(Exception):
    pass


def check_device_name(requested: str) -> None:
    """A CUDA device's name checked before anything starts (no torch): cuda or cuda:N."""
    if requested.startswith("cuda") and not (requested == "cuda" or
                                             (requested.startswith("cuda:") and requested[5:].isdigit())):
        raise DeviceUnavailable(f"device {requested!r}: expected cuda or cuda:N")


def probe_device(requested: str = "auto", cuda: CudaQuery | None = None,
                 cpu_info: tuple[str, frozenset[str]] | None = None,
                 cpu_fp16_autocast: bool | None = None) -> DeviceInfo:
    """Resolve 'auto' | 'cpu' | 'cuda' | 'cuda:N' to a concrete device and describe it."""
    cuda = cuda or CudaQuery()
    cpu_model, cpu_flags = cpu_info or read_cpu_info()
    cpu_flags = effective_cpu_flags(cpu_flags)
    if requested == "auto":
        requested = "cuda" if cuda.is_available() else "cpu"
    if requested == "cpu":
        fp16 = cpu_fp16_autocast_works() if cpu_fp16_autocast is None else cpu_fp16_autocast
        return DeviceInfo("cpu", cpu_model or "cpu", cpu_model=cpu_model, cpu_flags=cpu_flags, cpu_fp16_autocast=fp16)
    if requested == "cuda" or requested.startswith("cuda:"):
        check_device_name(requested)
        index = int(requested.partition(":")[2] or "0")
        if not cuda.is_available():
            raise DeviceUnavailable(f"device {requested!r}: no CUDA device is available "
                                    "(torch.cuda.is_available() is False)")
        if index >= cuda.device_count():
            raise DeviceUnavailable(f"device {requested!r}: only {cuda.device_count()} CUDA device(s)")
        name, capability, memory = cuda.properties(index)
        return DeviceInfo("cuda", name, index=index, capability=capability, total_memory_bytes=memory,
                          cpu_model=cpu_model, cpu_flags=cpu_flags, uuid=cuda.uuid(index))
    raise DeviceUnavailable(f"device {requested!r}: expected auto, cpu, cuda or cuda:N")


def describe_support(device: DeviceInfo) -> list[tuple[str, Support]]:
    return [(mode, precision_support(mode, device)) for mode in modes.names()]
