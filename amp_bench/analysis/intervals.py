"""The intervals and verdicts `compare` reads: the bootstrap ratio of medians, Welch's t on the
repeats' medians, the Mann-Whitney p-value, the night-noise widening and the threshold judgement.
Torch-free; numpy, and scipy only where a test or a quantile needs it (never inside a measured window)."""
from __future__ import annotations

import numpy as np

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
    from scipy.stats import t as student_t
    if min(len(base), len(cand)) < MIN_REPEATS:
        return None
    lb = np.log([np.median(x) for x in base])
    lc = np.log([np.median(x) for x in cand])
    vb, vc = lb.var(ddof=1) / lb.size, lc.var(ddof=1) / lc.size
    if vb + vc <= 0:
        return None
    df = (vb + vc) ** 2 / (vb ** 2 / (lb.size - 1) + vc ** 2 / (lc.size - 1))
    half = student_t.ppf(1 - (1 - level) / 2, df) * np.sqrt(vb + vc)
    diff = lc.mean() - lb.mean()
    return float(np.exp(diff - half)), float(np.exp(diff + half))


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


def _spread(base: list[np.ndarray], cand: list[np.ndarray]) -> str:
    """'repeat medians vary by 7% (baseline) and 14% (candidate)': max / min - 1 within each side."""
    def one(side):
        medians = [float(np.median(x)) for x in side]
        return max(medians) / min(medians) - 1
    return f"repeat medians vary by {one(base):.0%} (baseline) and {one(cand):.0%} (candidate)"


def _widen(ratio: float, low: float, high: float, floor: float | None) -> tuple[float, float]:
    """Add a series' night-to-night noise (log sd per night; two nights differ by sqrt(2) of it) to
    the interval, in quadrature in log space."""
    if not floor:
        return low, high
    extra = 1.96 * np.sqrt(2) * floor
    lo = np.log(ratio) - np.hypot(np.log(ratio) - np.log(low), extra)
    hi = np.log(ratio) + np.hypot(np.log(high) - np.log(ratio), extra)
    return float(np.exp(lo)), float(np.exp(hi))
