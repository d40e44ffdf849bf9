"""The ceiling: the step a precision mode could reach on this hardware if every category ran at its
ideal for that mode, against the baseline's profiled step; torch-free.

Why by hand: no tool bounds an AMP speedup per category. The ideal speedup of each category:
- GEMM, conv, attention: the peak-rate ratio of the mode's math unit to the baseline's. GPUs: the
  rows' dense peaks (platform/peaks.py, datasheets; fp8 runs its linears at the fp8 rate and the
  rest at bf16's). CPUs: from the ISA the hardware gate reads (results column `cpu_bf16_isa`): AMX
  (AMX-BF16 / AMX-FP16) 16x, 1024 16-bit FLOPs per cycle per core against 64 FP32 FLOPs from two
  AVX-512 FMA units (Intel's AMX and AVX-512 figures, Sapphire Rapids); AVX512-BF16 (VDPBF16PS) or
  AVX512-FP16 2x, twice the multiply-adds of an FP32 FMA per 512-bit instruction; without them 1x
  (the mode is emulated: no faster unit).
- elementwise, norms, reductions, layout: the byte ratio, 2x for 16-bit activations (1x when the
  mode has no autocast: a TF32 step moves the same bytes as FP32).
- optimizer and communication: 1x (master weights and gradients stay FP32 under autocast, and DDP
  all-reduces FP32 gradients); casts: 0 ms (the ideal mode casts nothing); host time: 1x; other: 1x.
A mode's step measured above the ceiling means a category beat its ideal (its baseline time was
not at the hardware's limit: a slow FP32 path), or the profile and the timed windows disagree:
the sentence says which (decompose.py).
"""
from __future__ import annotations

from dataclasses import dataclass

from amp_bench import modes
from amp_bench.analysis.explain.categories import ACCELERATED, CATEGORIES, HOST, MEMORY_BOUND

BYTE_RATIO = 2.0  # fp32 activations (4 bytes) against 16-bit ones (2 bytes)
CPU_UNITS = (  # (ISA flag, the autocast dtype it accelerates, peak ratio against AVX-512 FP32, name)
    ("amx_bf16", "bfloat16", 16.0, "AMX-BF16"), ("amx_fp16", "float16", 16.0, "AMX-FP16"),
    ("avx512_bf16", "bfloat16", 2.0, "AVX512-BF16"), ("avx512_fp16", "float16", 2.0, "AVX512-FP16"),
)
UNCHANGED = ("optimizer", "communication", "other", HOST)


@dataclass
class Ideal:
    """Each category's ideal speedup for a mode (cast: None, its ideal time is 0) and why."""
    factors: dict[str, float | None]
    accelerated_source: str


def cpu_unit(precision: str, cpu_isa: str) -> tuple[float, str]:
    """(peak ratio, unit) of a mode's GEMM/conv on a CPU with these flags (`cpu_bf16_isa` column)."""
    dtype = modes.get(precision).autocast_dtype if precision in modes.names() else None
    flags = set(str(cpu_isa or "").split(","))
    if modes.get(precision).float8_linear if precision in modes.names() else False:
        return 1.0, "no CPU has FP8 units (emulated)"
    for flag, unit_dtype, ratio, name in CPU_UNITS:
        if flag in flags and unit_dtype == dtype:
            return ratio, f"{name}: {ratio:g}x the FP32 AVX-512 peak"
    return 1.0, "no 16-bit matrix unit on this CPU (emulated)" if dtype else "the same FP32 units"


def gpu_units(mode_peak: float | None, base_peak: float | None, mode_peak_bf16: float | None = None,
              precision: str = "") -> tuple[dict[str, float] | None, str]:
    """GEMM/conv/attention peak ratios from the rows' dense peaks (TFLOP/s); None when one is unknown."""
    if not mode_peak or not base_peak:
        return None, "no peak rate known for this GPU and mode (platform/peaks.py): no ceiling"
    ratio = mode_peak / base_peak
    rest = ratio
    if precision in modes.names() and modes.get(precision).float8_linear and mode_peak_bf16:
        rest = mode_peak_bf16 / base_peak  # fp8 converts the linears; convolutions and attention run bf16
    units = {"gemm": ratio, "conv": rest, "attention": rest}
    return units, f"peak ratio {ratio:.3g}x ({mode_peak:g} / {base_peak:g} TFLOP/s)"


def ideal_factors(precision: str, accelerated: dict[str, float] | None, source: str,
                  bandwidth_ratio: float = 1.0) -> Ideal:
    """Every category's ideal speedup under `precision` (against an FP32-math baseline). Two traces from
    different GPUs: `bandwidth_ratio` (the mode's GPU's memory bandwidth over the baseline's) moves the
    memory-bound categories, the optimizer's included, on top of their byte ratio."""
    autocast = precision in modes.names() and modes.get(precision).uses_autocast
    factors: dict[str, float | None] = {}
    for category in list(CATEGORIES) + [HOST]:
        if category in ACCELERATED:
            factors[category] = (accelerated or {}).get(category)
        elif category == "cast":
            factors[category] = None
        elif category in UNCHANGED:
            factors[category] = bandwidth_ratio if category in MEMORY_BOUND else 1.0
        else:
            factors[category] = (BYTE_RATIO if autocast else 1.0) * bandwidth_ratio
    return Ideal(factors, source)


def ideal_ms(base: dict[str, float], ideal: Ideal) -> dict[str, float] | None:
    """The mode's step at its ideal, per category; None when an accelerated factor is unknown while
    the baseline spends time there."""
    out = {}
    for category, ms in base.items():
        factor = ideal.factors.get(category, 1.0)
        if factor is None and category != "cast" and ms > 0:
            return None
        out[category] = 0.0 if category == "cast" or factor is None else ms / factor
    return out


def ceiling(base: dict[str, float], ideal: Ideal) -> float | None:
    """base step / the ideal step: the speedup this hardware allows the mode."""
    best = ideal_ms(base, ideal)
    return sum(base.values()) / sum(best.values()) if best and sum(best.values()) > 0 else None


def held_back(base: dict[str, float], mode: dict[str, float], ideal: Ideal,
              limit: int = 3) -> list[tuple[str, float, str]]:
    """The categories furthest above their ideal in the mode's step, largest first:
    (category, share of the mode's step lost to it, how far: 'at 1.3x of 2x', '12% of the step')."""
    best = ideal_ms(base, ideal) or {}
    total = sum(mode.values())
    out = []
    for category, ms in mode.items():
        lost = ms - best.get(category, ms)
        if total <= 0 or lost / total < 0.03:
            continue
        factor, b = ideal.factors.get(category), base.get(category, 0.0)
        if category == "cast" or category == HOST or factor is None or b <= 0:
            how = f"{ms / total:.0%} of the step"
        else:
            how = f"at {b / ms:.2f}x of {factor:.2g}x" if ms > 0 else f"{lost / total:.0%} of the step"
        out.append((category, lost / total, how))
    return sorted(out, key=lambda item: -item[1])[:limit]


def beat_ideal(base: dict[str, float], mode: dict[str, float], ideal: Ideal) -> list[tuple[str, float, float]]:
    """Categories that got faster than their ideal allows: (category, achieved speedup, ideal)."""
    out = []
    for category, b in base.items():
        factor, m = ideal.factors.get(category), mode.get(category, 0.0)
        if factor and b > 0 and m > 0 and b / m > factor * 1.05:
            out.append((category, b / m, factor))
    return out
