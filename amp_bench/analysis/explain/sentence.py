"""The sentence that says why a mode's speedup is what it is (decompose.Decomposition in, one line
out); torch-free. Written by hand: it is this project's own reading of its own figures.

What it holds to: a category is called faster or slower only beyond its noise (else "did
not change beyond its noise (±x%)"); the measured speedup is set against the ceiling this hardware
allows, with what holds the rest back, largest first; a measured speedup above the ceiling says why;
a profile that disagrees with the timed windows says so, in either direction, and that the
breakdown then does not explain the measurement.
"""
from __future__ import annotations

from amp_bench import modes
from amp_bench.analysis.explain.categories import ACCELERATED, HOST, LABELS, MEMORY_BOUND

ACTIVATION_BOUND = tuple(k for k in MEMORY_BOUND if k != "optimizer")  # what 16-bit activations speed up


def _join(labels: list[str]) -> str:
    return labels[0] if len(labels) == 1 else ", ".join(labels[:-1]) + " and " + labels[-1]


def _faster(factor: float) -> str:
    """'2.6x faster', for a slowdown '7.7x slower' (never '0.1x faster')."""
    return f"{factor:.1f}x faster" if factor >= 1 else f"{1 / factor:.1f}x slower"


def speed(factor: float) -> str:
    """A whole step's speedup: '1.6x', or for a slowdown '22.1x slower' (never '0.0x')."""
    return f"{factor:.2g}x" if factor >= 0.95 else f"{1 / factor:.2g}x slower"


def _within_noise(d, keys, factor: float | None) -> bool:
    """No change to speak of: inside the noise rule's spread, or (without samples) within 5%."""
    verdict = d.changed(keys)
    if verdict is None:
        return factor is None or abs(factor - 1) < 0.05
    return not verdict


def _accelerated(d, mode: str, share) -> str:
    t = d.table.set_index("category")
    present = [k for k in ACCELERATED if share.get(k, 0.0) >= 0.01] or [k for k in ACCELERATED
                                                                        if t.loc[k, "base_ms"] > 0]
    if not present or not d.accelerated_speedup:
        return f"{mode}: no GEMM, convolution or attention time in the {d.baseline} profile"
    names, they = "+".join(LABELS[k] for k in present), "they are" if len(present) > 1 else "it is"
    if _within_noise(d, ACCELERATED, d.accelerated_speedup):
        return (f"under {mode} {names} did not change beyond {'their' if len(present) > 1 else 'its'} noise "
                f"(±{d.noise_width(ACCELERATED):.0%}); {they} {d.accelerated_share:.0%} of the {d.baseline} step")
    link = "but" if d.accelerated_speedup >= 1 else "and"  # 'but': the rest limits the gain
    return (f"{mode} made {names} {_faster(d.accelerated_speedup)}, {link} {they} {d.accelerated_share:.0%} of the "
            f"{d.baseline} step")


def _memory(d, share) -> str | None:
    t = d.table.set_index("category")
    memory = sorted((k for k in ACTIVATION_BOUND if share.get(k, 0.0) >= 0.05), key=lambda k: -share[k])[:3]
    if not memory:
        return None
    b, m = t.loc[memory, "base_ms"].sum(), t.loc[memory, "mode_ms"].sum()
    gain = b / m if b > 0 and m > 0 else None
    head = f"{_join([LABELS[k] for k in memory])} ({share[memory].sum():.0%})"
    if gain is None or _within_noise(d, memory, gain):
        width = d.noise_width(memory)
        return f"{head} did not change beyond their noise" + (f" (±{width:.0%})" if width else "")
    return f"{head} gained {gain:.1f}x" if gain >= 1 else f"{head} ran {1 / gain:.1f}x slower"


def _optimizer(d, share) -> str | None:
    """The optimizer runs the same FP32 math under autocast: said only when it moved beyond its noise."""
    t = d.table.set_index("category")
    if share.get("optimizer", 0.0) < 0.05 or "optimizer" not in t.index or not d.changed(["optimizer"]):
        return None
    b, m = t.loc["optimizer", "base_ms"], t.loc["optimizer", "mode_ms"]
    gained = max(b, m) / max(min(b, m), 1e-9)
    return f"the optimizer ({share['optimizer']:.0%}) {'gained' if b > m else 'lost'} {gained:.1f}x"


def _against_ceiling(d) -> str:
    measured = f"{speed(d.measured_speedup)} measured" if d.measured_speedup else \
        f"{speed(d.profiled_speedup)} in the profiled steps" if d.profiled_speedup else "no speedup figure"
    if not d.ceiling:
        why = d.ideal.accelerated_source if d.ideal else "no ceiling known"
        return f"{measured} ({why})"
    text = f"{measured}, of a {speed(d.ceiling)} ceiling"
    held = [f"{'host time' if k == HOST else LABELS[k]} {how}" for k, _, how in d.held_back]
    figure = d.measured_speedup or d.profiled_speedup or 0.0
    if figure > d.ceiling:
        text += f"; above it, {_above_ceiling(d)}"
    elif held:
        text += "; held back by: " + ", ".join(held)
    return text


def _above_ceiling(d) -> str:
    """Why a measured speedup beat the ceiling: the measurement's own noise, a profile that stays
    under the ceiling (the two disagree), or categories that beat their ideal in the profile too."""
    low = d.measured_interval[0] if d.measured_interval else None
    if low is not None and low <= d.ceiling:
        return f"but within the measurement's noise (its interval reaches down to {low:.2f}x)"
    profiled = d.profiled_speedup
    if d.measured_speedup and profiled and profiled <= d.ceiling * 1.02:
        return (f"while the profiled steps show {speed(profiled)}, under it: the timed windows and the profile "
                "disagree, and the profile's figure is the one the ceiling bounds")
    beyond = [(k, got, ideal) for k, got, ideal in d.beat_ideal  # beyond its ideal by more than its noise
              if (d.speedup_interval([k]) or (got, got))[0] > ideal]
    if beyond:
        parts = [f"{LABELS[k]} gained {got:.1f}x against an ideal {ideal:.2g}x" for k, got, ideal in beyond]
        return (_join(parts) + f": the {d.baseline} step's time there was not at this hardware's limit "
                "(a slow FP32 path), so the ceiling, built on it, is low")
    return "but no category beat its ideal beyond its noise: the excess is within the profiled steps' spread"


def _disagreement(d) -> str:
    """The profiled against the measured speedup whenever they differ: 'they disagree' when their
    intervals do not overlap (the breakdown then does not explain the measurement), else, when the
    two figures are more than 25% apart, that the noise, not the breakdown, decides."""
    profiled, measured = d.profiled_interval, d.measured_interval
    if profiled is None or not d.profiled_speedup or not d.measured_speedup:
        return ""
    shown = f" ({measured[0]:.2f}-{measured[1]:.2f}x)" if measured else ""
    figures = (f"the profiled steps show {speed(d.profiled_speedup)} ({profiled[0]:.2f}-{profiled[1]:.2f}x) against "
               f"{speed(d.measured_speedup)} measured{shown}")
    if not d.explains_measurement:
        return f"; {figures}: they disagree, so this breakdown does not explain the measured figure"
    if max(d.profiled_speedup, d.measured_speedup) / min(d.profiled_speedup, d.measured_speedup) > 1.25:
        return f"; {figures}: the intervals overlap, so the noise, not this breakdown, decides"
    return ""


def sentence(d) -> str:
    """One sentence per mode, e.g. 'amp_bf16 made conv 2.2x faster, but it is 72% of the fp32 step;
    norms and elementwise (20%) gained 2.1x; casts added 1%: 1.7x measured, of a 2.4x ceiling; held
    back by: host time 12% of the step, norms at 1.3x of 2x'."""
    share = d.table.set_index("category")["base_share"].fillna(0.0)
    mode = modes.with_emulated(d.mode, d.emulated)  # an emulated mode's breakdown explains the emulation
    parts = [_accelerated(d, mode, share)] + [p for p in (_memory(d, share), _optimizer(d, share)) if p]
    parts.append(f"casts added {d.cast_added_share:.0%}" if d.cast_added_share >= 0.005 else
                 f"casts took {share.get('cast', 0.0):.0%}")
    text = "; ".join(parts) + ": " + _against_ceiling(d) + _disagreement(d)
    t = d.table.set_index("category")
    host = t["mode_ms"].get(HOST, 0.0) / d.mode_total_ms if HOST in t.index and d.mode_total_ms else 0.0
    idle = "the device sat idle" if d.device_type == "cuda" else "Python and framework time between ops took"
    if host >= 0.10 and not any(k == HOST for k, _, _ in d.held_back):
        text += f" ({idle} {host:.0%} of the {d.mode} step)"
    if d.distorted:
        text += " (breakdown distorted: the profiler slowed a step by more than 1.5x)"
    return text + "".join(f" ({note})" for note in d.notes)
