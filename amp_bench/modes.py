"""The precision modes: the one list every other module reads (torch-free).

A mode's name, its place in tables and charts, its family, whether speedups are given against it,
its autocast dtype and GradScaler use, how FP32 math runs around autocast, which dense peak rate
its MFU is measured against, its chart colour, and what hardware runs it natively. Adding a mode
means adding an entry here (plus, when its autocast/scaler policy is new, that policy in
measure/precision.py); the hardware gate, suite validation, summary, report and peak table read it from
here. Readers look the registry up at call time (`names()`, `get()`), never copy it at import.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mode:
    name: str
    family: str  # "fp32" (full-precision tensors) or "amp" (an autocast region)
    autocast_dtype: str | None  # torch dtype name inside autocast ("float16", "bfloat16"); None: no autocast
    grad_scaler: bool  # torch.amp.GradScaler around backward/step
    fp32_math: str  # "ieee" or "tf32": how FP32 matmuls/convolutions run outside autocast
    peak_math: str  # key of the dense peak rate in peaks.PEAKS that MFU is measured against
    colour: str  # chart colour
    label: str = ""  # how a sentence names it ("bf16 autocast"); the name when empty
    baseline: bool = False  # speedups and savings are given against this mode
    # Hardware. CUDA: native from this compute capability; below it the mode either does not exist
    # ("unsupported") or runs slowly in software ("emulated").
    cuda_min_capability: tuple[int, int] = (0, 0)
    cuda_below: str = "unsupported"
    cuda_requirement: str = ""  # what the reason says below cuda_min_capability
    # CPU: "always" (no special ISA), "isa" (native with one of cpu_isa_flags, emulated without),
    # "emulated" (software only, on every CPU), or "never" (the mode does not exist on a CPU; cpu_requirement says why).
    cpu: str = "always"
    cpu_isa_flags: tuple[str, ...] = ()
    cpu_requirement: str = ""
    # CPU "emulated": the mode exists on every CPU but only in software (fp8: torch's _scaled_mm).
    # An optional package the mode needs (import name, versions that work, what to install), checked
    # by the gate before the hardware: without it the mode is unsupported with the install hint.
    package: str = ""
    package_versions: tuple[str, str] = ("", "")  # [lowest, first unsupported) release
    package_hint: str = ""
    float8_linear: bool = False  # nn.Linear layers train in float8 (torchao), the rest under autocast
    compiled_by_default: bool = False  # the case trains under torch.compile unless the suite says not
    also_against: str = ""  # the fidelity verdict is also given against this mode (fp8: bf16)

    @property
    def is_amp(self) -> bool:
        return self.family == "amp"

    @property
    def uses_autocast(self) -> bool:
        return self.autocast_dtype is not None


# Under the AMP modes the ops autocast leaves in FP32 run as strict IEEE FP32, like the fp32
# baseline, so the only difference between fp32 and amp_* is autocast (and the scaler).
_REGISTRY: dict[str, Mode] = {}


def register(mode: Mode) -> Mode:
    """Add a mode at the end of the order (tests register fake ones)."""
    if mode.name in _REGISTRY:
        raise ValueError(f"precision mode {mode.name!r} is already registered")
    _REGISTRY[mode.name] = mode
    return mode


def unregister(name: str) -> None:
    _REGISTRY.pop(name, None)


register(Mode("fp32", "fp32", None, False, "ieee", "fp32", "#636efa", label="fp32", baseline=True))
register(Mode("tf32", "fp32", None, False, "tf32", "tf32", "#00cc96", label="TF32", baseline=True,
              cuda_min_capability=(8, 0), cuda_requirement="TF32 needs compute capability >= 8.0 (Ampere)",
              cpu="never", cpu_requirement="TF32 is a CUDA tensor-core mode; the CPU has no TF32"))
register(Mode("amp_fp16", "amp", "float16", True, "ieee", "fp16", "#ef553b", label="fp16 autocast",
              cuda_min_capability=(7, 0), cuda_below="emulated",
              cuda_requirement="fp16 tensor cores need compute capability >= 7.0",
              # AVX512-FP16 alone is not enough: on a Sapphire Rapids (AVX512-FP16, AMX-BF16, no AMX-FP16)
              # torch 2.14's fp16 conv backward ran 38x slower than fp32 and a ResNet-18 step 22x
              # (a ResNet-50 step would outlast the main job's case deadline); only AMX-FP16 counts
              cpu="isa", cpu_isa_flags=("amx_fp16",),
              cpu_requirement="CPU has no AMX-FP16: fp16 autocast runs emulated or on slow paths"))
register(Mode("amp_bf16", "amp", "bfloat16", False, "ieee", "bf16", "#ab63fa", label="bf16 autocast",
              cuda_min_capability=(8, 0), cuda_below="emulated",
              cuda_requirement="bf16 needs compute capability >= 8.0 (emulated and slow below)",
              cpu="isa", cpu_isa_flags=("amx_bf16", "avx512_bf16"),
              cpu_requirement="CPU has no AVX512-BF16/AMX-BF16: bf16 autocast runs emulated"))
# torchao's float8 training on the linear layers, bf16 autocast for the rest (fp8.py); torchao 0.18 is
# the release built against torch 2.11 and imports on 2.14 (its float8 training is pure Python).
register(Mode("fp8", "amp", "bfloat16", False, "ieee", "fp8", "#ffa15a", label="fp8 (float8 linears)",
              cuda_min_capability=(8, 9),
              cuda_requirement="FP8 tensor cores need compute capability >= 8.9 (Ada, Hopper)",
              cpu="emulated", cpu_requirement="no CPU has FP8 matmul units: torch's _scaled_mm runs float8 in software",
              package="torchao", package_versions=("0.18", "0.19"),
              package_hint="fp8 needs torchao 0.18: pip install -e '.[fp8]'",
              float8_linear=True, compiled_by_default=True, also_against="amp_bf16"))


def names() -> tuple[str, ...]:
    return tuple(_REGISTRY)


def get(name: str) -> Mode:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown precision {name!r} (expected one of {', '.join(_REGISTRY)})") from None


def amp_names() -> tuple[str, ...]:
    return tuple(m.name for m in _REGISTRY.values() if m.is_amp)


def baseline_names() -> tuple[str, ...]:
    return tuple(m.name for m in _REGISTRY.values() if m.baseline)


def reference() -> str:
    """The mode every speedup and memory saving is first given against (the first baseline: fp32);
    later baselines (tf32) get their own speedup columns."""
    return baseline_names()[0]


def scaler_names() -> tuple[str, ...]:
    return tuple(m.name for m in _REGISTRY.values() if m.grad_scaler)


def order() -> list[str]:
    return list(_REGISTRY)


def order_key(name: str) -> int:
    """Sort key: registry order, unknown names last."""
    order_ = order()
    return order_.index(name) if name in order_ else len(order_)


def label(name: str) -> str:
    mode = _REGISTRY.get(name)
    return (mode.label or mode.name) if mode else name


EMULATED = "emulated"


def with_emulated(text: str, emulated: bool, why: str = "") -> str:
    """'amp_bf16 (emulated)', or with why 'bf16 autocast (emulated: no AVX512-BF16)': a figure from a
    mode the hardware only emulates is never shown without saying so. The one place the label is
    built (run table, headline, report summary, claims verdict; the speedup chart's bar word)."""
    if not emulated:
        return text
    return f"{text} ({EMULATED}: {why})" if why else f"{text} ({EMULATED})"


def colours() -> dict[str, str]:
    return {m.name: m.colour for m in _REGISTRY.values()}
