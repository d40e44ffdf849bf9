"""The intervals and verdicts: the bootstrap ratio of medians, Welch's t on the repeats' medians, the
paired speedup's t interval (speedups.py), the Mann-Whitney p-value, the night-noise widening, the
thresholds and the judgement `compare` and drift.py apply.
Torch-free; numpy, and scipy only where a test or a quantile needs it (never inside a measured window)."""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from amp_bench.errors import UserError

@dataclass(frozen=True)
class Threshold:
    """'3%' (relative) or '0B' / '64MiB' (absolute bytes, memory only)."""
    relative: float | None = None
    absolute_bytes: int | None = None

    @classmethod
    def parse(cls, text: str, what: str, allow_bytes: bool = False) -> Threshold:
        text = str(text).strip()
        match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*%", text)
        if match:
            return cls(relative=float(match.group(1)) / 100)
        units = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
        match = re.fullmatch(r"(\d+)\s*(B|KiB|MiB|GiB)", text)
        if match and allow_bytes:
            return cls(absolute_bytes=int(match.group(1)) * units[match.group(2)])
        expected = "a percentage like 3%" + (" or a size like 0B / 64MiB" if allow_bytes else "")
        raise UserError(f"--threshold-{what}: expected {expected}, got {text!r}")

    def __str__(self) -> str:
        return f"{self.relative:.1%}" if self.relative is not None else f"{self.absolute_bytes} B"


MIN_REPEATS = 3  # per side: fewer cannot show run-to-run variance (unless history gives the noise floor)
BOOTSTRAP = 2000


def bootstrap_median_ratio(base: list[np.ndarray], cand: list[np.ndarray], rng: np.random.Generator,
                           iterations: int = BOOTSTRAP, level: float = 0.95) -> tuple[float, float, float]:
    """Ratio of medians (cand / base) and its percentile interval. Each side is a list of per-repeat
    sample arrays: each iteration resamples the repeats (from three on: a bootstrap over two
    clusters only flips between them), then the samples within each chosen repeat."""
    def medians(side: list[np.ndarray]) -> np.ndarray:
        out = np.empty(iterations)
        for i in range(iterations):
            chosen = rng.integers(0, len(side), len(side)) if len(side) >= 3 else range(len(side))
            pooled = np.concatenate([rng.choice(side[j], size=len(side[j]), replace=True) for j in chosen])
            out[i] = np.median(pooled)
        return out
    point = np.median(np.concatenate(cand)) / np.median(np.concatenate(base))
    ratios = medians(cand) / medians(base)
    alpha = (1 - level) / 2
    return float(point), float(np.quantile(ratios, alpha)), float(np.quantile(ratios, 1 - alpha))


def repeats_interval(base: list[np.ndarray], cand: list[np.ndarray], level: float = 0.95) -> tuple[float, float] | None:
    """The ratio's interval from the repeats alone: Welch's t on the log of each repeat's median (each
    repeat is one fresh process, so the repeats are the independent units). A percentile bootstrap
    over three repeats understates the spread between processes: two quiet runs of the same suite on
    one VM, whose processes differed by up to 15%, read as a 16% 'regression' with it alone. None
    below MIN_REPEATS a side, or when the repeats agree exactly."""
    if min(len(base), len(cand)) < MIN_REPEATS:
        return None
    found = welch_log_interval(np.log([np.median(x) for x in base]), np.log([np.median(x) for x in cand]), level)
    if found is None or found[1] == found[2]:
        return None
    return found[1], found[2]


def paired_log_interval(log_ratios, level: float = 0.95) -> tuple[float, float, float] | None:
    """The paired speedup and its interval: each repeat ran every mode back to back (rotating which went
    first), so the ratio within a repeat cancels whatever the machine did between repeats (a VM drifting
    10-40% in an hour). Point: the geometric mean of the per-repeat ratios; interval: Student's t on
    their logs (the repeats are the independent units). None without two finite ratios."""
    logs = np.asarray([x for x in log_ratios if np.isfinite(x)], dtype=float)
    if logs.size < 2:
        return None
    mean, half = logs.mean(), 0.0
    spread = logs.std(ddof=1)
    if spread > 0:
        half = _t_quantile(1 - (1 - level) / 2, logs.size - 1) * spread / np.sqrt(logs.size)
    return float(np.exp(mean)), float(np.exp(mean - half)), float(np.exp(mean + half))


def welch_log_interval(base_logs, cand_logs, level: float = 0.95) -> tuple[float, float, float] | None:
    """exp(mean(cand) - mean(base)) and Welch's t interval, both sides given as logs (one value per
    independent unit: a repeat's median, a repeat's paired speedup). None below two values a side."""
    lb, lc = np.asarray(base_logs, dtype=float), np.asarray(cand_logs, dtype=float)
    if min(lb.size, lc.size) < 2:
        return None
    diff = lc.mean() - lb.mean()
    vb, vc = lb.var(ddof=1) / lb.size, lc.var(ddof=1) / lc.size
    if vb + vc <= 0:
        return float(np.exp(diff)), float(np.exp(diff)), float(np.exp(diff))
    df = (vb + vc) ** 2 / (vb ** 2 / (lb.size - 1) + vc ** 2 / (lc.size - 1))
    half = _t_quantile(1 - (1 - level) / 2, df) * np.sqrt(vb + vc)
    return float(np.exp(diff)), float(np.exp(diff - half)), float(np.exp(diff + half))


def _t_quantile(p: float, df: float) -> float:
    """Student's t quantile: scipy.special's stdtrit, the function scipy.stats.t.ppf evaluates, without
    importing scipy.stats (0.9 s of every CLI command that prints a speedup, on a 2-core VM)."""
    from scipy.special import stdtrit
    return float(stdtrit(df, p))


def mann_whitney_p(base: np.ndarray, cand: np.ndarray) -> float:
    from scipy.stats import mannwhitneyu
    return float(mannwhitneyu(cand, base, alternative="two-sided").pvalue)


def judge(ratio_low: float, ratio_high: float, threshold: float, worse_when_higher: bool) -> str:
    """Regression only when the whole interval is beyond the threshold in the bad direction."""
    if not worse_when_higher:  # throughput: lower is worse; flip to "higher is worse"
        ratio_low, ratio_high = 1 / ratio_high, 1 / ratio_low
    if ratio_low > 1 + threshold:
        return "regression"
    if ratio_high < 1 - threshold:
        return "improvement"
    if ratio_high - ratio_low > 4 * threshold:
        return "unstable"  # the interval is too wide to rule a change of the threshold's size in or out
    return "no change"


def spread_text(base: list[np.ndarray], cand: list[np.ndarray]) -> str:
    """'repeat medians vary by 7% (baseline) and 14% (candidate)': max / min - 1 within each side."""
    def one(side):
        medians = [float(np.median(x)) for x in side]
        return max(medians) / min(medians) - 1
    return f"repeat medians vary by {one(base):.0%} (baseline) and {one(cand):.0%} (candidate)"


def widen_by_noise(ratio: float, low: float, high: float, floor: float | None) -> tuple[float, float]:
    """Add a series' night-to-night noise (log sd per night; two nights differ by sqrt(2) of it) to
    the interval, in quadrature in log space."""
    if not floor:
        return low, high
    extra = 1.96 * np.sqrt(2) * floor
    lo = np.log(ratio) - np.hypot(np.log(ratio) - np.log(low), extra)
    hi = np.log(ratio) + np.hypot(np.log(high) - np.log(ratio), extra)
    return float(np.exp(lo)), float(np.exp(hi))
