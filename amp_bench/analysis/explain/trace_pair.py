"""Two traces, one read against the other (`explain --trace A --trace B`): what differs between them
besides the precision the user names (the GPU, the model, the number format the GEMMs ran in), said
before the decomposition, and the ceiling priced on each trace's own GPU; torch-free.

Why: a decomposition of B against A reads every change as the mode's doing. Two traces a user hands
over may come from different GPUs, models or batch sizes, and `--modes` is only the user's word for
which precision each ran: a V100 FP32 trace against an A100 TF32 trace of another model read as
"amp_bf16 made GEMM+conv 4.5x faster" is wrong three ways. The model is compared on what does not
change with the precision: the GEMM/conv layer shapes (when recorded) and the kernels (GPU) or ops
(CPU) other than GEMM/conv, casts and collectives, with their number formats blanked; the precision
on what GEMM/conv kernel names (GPU) or their ops' recorded input types (CPU) say.
"""
from __future__ import annotations

import json

from amp_bench import modes as registry
from amp_bench.analysis.explain.categories import ACCELERATED
from amp_bench.analysis.explain.ceiling import Ideal, cpu_unit, ideal_factors
from amp_bench.analysis.explain.events import Profile
from amp_bench.analysis.explain.kernels import MATH_LABELS, dominant_math
from amp_bench.platform.gpu_specs import find

# Below this share in common (Jaccard: shared over either's), two traces are called different models.
# The same model in fp32 and amp_bf16 shares every layer shape and op (this project's ResNet-18 CPU
# traces: 14 of 14 shapes, 69 of 69 ops); HTA's trace_diff control (A100) and test (V100) traces share
# 13% of their shapes.
SAME_MODEL = 0.5


def overlap(a, b) -> float | None:
    """The share of the two sets' union that both hold; None when both are empty."""
    a, b = set(a), set(b)
    return len(a & b) / len(a | b) if a | b else None


def _device(names, profiles: list[Profile]) -> list[tuple[str, str]]:
    devices = [p.device_name or f"an unnamed {p.device_type.upper()} device" for p in profiles]
    if devices[0] == devices[1]:
        return []
    return [("device", f"device: {names[0]} ran on {devices[0]}, {names[1]} on {devices[1]}: the comparison mixes the "
            "device with the precision")]


def _model(names, profiles: list[Profile]) -> list[tuple[str, str]]:
    said = []
    layers = [{(s["op"], json.dumps(s["dims"])) for s in p.shapes} for p in profiles]
    shared = overlap(*layers) if all(layers) else None
    if shared is not None and shared < SAME_MODEL:
        said.append(f"{len(layers[0] & layers[1])} of {len(layers[0] | layers[1])} GEMM/conv layer shapes in common")
    kernels = [p.kernel_set for p in profiles]
    shared = overlap(*kernels) if all(kernels) else None
    what = "kernels" if profiles[0].device_type == "cuda" else "ops"
    if shared is not None and shared < SAME_MODEL:
        said.append(f"{shared:.0%} of their {what} besides GEMM/conv, casts and collectives in common")
    if not said:
        return []
    return [("model", f"model: {names[0]} and {names[1]} look like different models (or batch or sequence "
                      "lengths): " + "; ".join(said))]


def _expected_math(precision: str) -> tuple[str, ...]:
    """The number formats a mode's GEMM/conv run in (fp8 converts the linears only)."""
    mode = registry.get(precision)
    return (mode.peak_math, "bf16") if mode.float8_linear else (mode.peak_math,)


def _precision(names, profiles: list[Profile], modes: tuple[str, str] | None) -> list[tuple[str, str]]:
    maths = [dominant_math(p.math_ms) for p in profiles]
    said = []
    if all(m for m, _ in maths) and maths[0][0] != maths[1][0]:
        (first, first_share), (second, second_share) = maths
        said.append(("precision", f"precision: {names[0]}'s GEMM/conv kernels ran {MATH_LABELS[first]} "
                                  f"({first_share:.0%} of their time), {names[1]}'s {MATH_LABELS[second]} "
                                  f"({second_share:.0%})"))
    for name, (math, share), precision in zip(names, maths, modes or (), strict=False):
        if math and math not in _expected_math(precision):
            said.append(("modes", f"precision: --modes says {name} ran {precision}, but its GEMM/conv kernels ran "
                                  f"{MATH_LABELS[math]} ({share:.0%} of their time)"))
    return said


def differences(names: list[str], profiles: list[Profile],
                modes: tuple[str, str] | None = None) -> list[tuple[str, str]]:
    """(kind, line) for each way the two traces differ: 'device', 'model', 'precision' (their GEMM/conv
    formats) and 'modes' (a format that is not what --modes says), for the reader to see before the
    decomposition; none when they are one model on one device in one format."""
    return _device(names, profiles) + _model(names, profiles) + _precision(names, profiles, modes)


def _gpu_ideal(names, profiles: list[Profile], modes: tuple[str, str]) -> tuple[Ideal | None, str]:
    specs, rates = [], []
    for name, profile, precision in zip(names, profiles, modes, strict=True):
        if not profile.device_name:
            return None, f"{name} names no GPU (no deviceProperties): no peak rate, so no ceiling"
        spec, unit = find(profile.device_name), registry.get(precision).peak_math
        rate = spec.peak(unit) if spec else None
        if rate is None:
            return None, (f"no dense {unit.upper()} peak for {profile.device_name!r} ({name}) in the spec table "
                          "(platform/gpu_specs.py): no ceiling")
        specs.append(spec)
        rates.append(rate)
    ratio, bandwidth = rates[1] / rates[0], specs[1].bandwidth_gbs / specs[0].bandwidth_gbs
    source = f"peak ratio {ratio:.3g}x ({modes[1]} {rates[1]:g} TFLOP/s on {specs[1].label} / {modes[0]} " \
             f"{rates[0]:g} on {specs[0].label})" + (f"; memory bandwidth {bandwidth:.3g}x" if bandwidth != 1 else "")
    return ideal_factors(modes[1], {k: ratio for k in ACCELERATED}, source, bandwidth), ""


def pair_ideal(names: list[str], profiles: list[Profile], modes: tuple[str, str] | None,
               cpu_isa: str | None = None) -> tuple[Ideal | None, str]:
    """(each category's ideal speedup of the second trace over the first, or None and why): on a GPU
    each side's peak on its own GPU (and the bandwidth ratio when the GPUs differ); on a CPU the ISA."""
    if not modes:
        return None, ("no ceiling: which precision each trace ran is not in a trace; give --modes BASE,MODE "
                      "(e.g. fp32,amp_bf16)")
    if profiles[0].device_type == "cuda":
        return _gpu_ideal(names, profiles, modes)
    ratio, source = cpu_unit(modes[1], cpu_isa or "")
    return ideal_factors(modes[1], {k: ratio for k in ACCELERATED}, source), ""
