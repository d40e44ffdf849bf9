"""The intervals and verdicts: the bootstrap ratio of medians, Welch's t on the repeats' medians, the
paired speedup's trimmed-mean interval (speedups.py) and Yuen's for two runs' speedups (drift.py), the
Mann-Whitney p-value, the night-noise widening, the thresholds and the judgement `compare` and drift.py
apply.
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
    point = np.median(np.concatenate(cand)) / np.median(np.concatenate(base))
    ratios = _resampled_medians(cand, rng, iterations) / _resampled_medians(base, rng, iterations)
    alpha = (1 - level) / 2
    return float(point), float(np.quantile(ratios, alpha)), float(np.quantile(ratios, 1 - alpha))


def _resampled_medians(side: list[np.ndarray], rng: np.random.Generator, iterations: int,
                       block_values: int = 2_000_000) -> np.ndarray:
    """One median per iteration, a block of iterations at a time (a loop of 2000 medians took most of
    `compare`'s time): row i holds iteration i's chosen repeats, each resampled and padded with +inf to the
    longest, so that the sorted row starts with its pooled samples. A block holds <= block_values samples."""
    lengths, repeats = np.array([len(x) for x in side]), len(side)
    starts, pooled = np.cumsum(lengths) - lengths, np.concatenate([*map(np.asarray, side), [np.inf]])
    slot, block, medians = np.arange(lengths.max()), max(1, block_values // (repeats * lengths.max())), []
    for n in [min(block, iterations - done) for done in range(0, iterations, block)]:
        chosen = rng.integers(0, repeats, (n, repeats)) if repeats >= 3 else np.tile(np.arange(repeats), (n, 1))
        length = lengths[chosen][..., None]  # (n, repeats, 1)
        picks = starts[chosen][..., None] + (rng.random((n, repeats, slot.size)) * length).astype(int)
        rows = np.sort(pooled[np.where(slot < length, picks, -1)].reshape(n, -1), axis=1)
        counts, row = length.sum(axis=(1, 2)), np.arange(n)
        medians.append((rows[row, (counts - 1) // 2] + rows[row, counts // 2]) / 2)
    return np.concatenate(medians)


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


# The paired speedup's estimator: the 20%-trimmed mean of the per-repeat log ratios with Yuen's
# standard error (one run: t on h - 1 degrees of freedom; two runs: Yuen's test), the textbook robust
# choice (Wilcox, "Introduction to Robust Estimation and Hypothesis Testing", ch. 4-5). On a shared VM
# a pair's two windows now and then straddle a slow spell: recorded on a 2-core EPYC, 16-pair smoke
# runs had log ratios within about +-0.1 of their centre and then single pairs at +0.87, +0.77 or
# -0.86. The plain mean's interval takes those in full; the trimmed one sets the extreme 20% a side to
# the nearest kept value (docs/measuring.md has the figures, and the run where it was the wider).
# Below five pairs nothing is trimmed: the same figures as the plain mean and Student's t.
TRIM = 0.2


def _trimmed(logs: np.ndarray, trim: float = TRIM) -> tuple[float, float, int]:
    """(trimmed mean, squared standard error, values kept h): the winsorized variance's
    (n - 1) s_w^2 / (h (h - 1)), which is s^2 / n when nothing is trimmed."""
    x = np.sort(logs)
    n = x.size
    if n < 2:  # one value: its own mean, no spread to tell
        return float(x.mean()), 0.0, n
    g = int(np.floor(trim * n))
    kept = n - 2 * g
    winsorized = np.clip(x, x[g], x[n - g - 1])
    return float(x[g:n - g].mean()), float((n - 1) * winsorized.var(ddof=1) / (kept * (kept - 1))), kept


def _finite(logs) -> np.ndarray:
    return np.asarray([x for x in logs if np.isfinite(x)], dtype=float)


def trimmed_log_mean(logs) -> float:
    """The paired speedup's point: exp of the trimmed mean of the logs (NaN without a finite one)."""
    finite = _finite(logs)
    return float(np.exp(_trimmed(finite)[0])) if finite.size else float("nan")


def paired_log_interval(log_ratios, level: float = 0.95) -> tuple[float, float, float] | None:
    """The paired speedup and its interval: each repeat ran every mode, one after the other (rotating
    which went first) or in lockstep (taking turns), so the ratio within a repeat cancels whatever the machine did
    between repeats (a VM drifting 10-40% in an hour). Point: exp of the trimmed mean (TRIM) of the per-repeat log
    ratios; interval: t with Yuen's standard error on h - 1 degrees of freedom (h: the values kept; the repeats are the
    independent units). None without two finite ratios."""
    logs = _finite(log_ratios)
    if logs.size < 2:
        return None
    mean, squared_error, kept = _trimmed(logs)
    half = _t_quantile(1 - (1 - level) / 2, kept - 1) * np.sqrt(squared_error) if squared_error > 0 else 0.0
    return float(np.exp(mean)), float(np.exp(mean - half)), float(np.exp(mean + half))


def trimmed_log_interval(base_logs, cand_logs, level: float = 0.95, trim: float = TRIM
                         ) -> tuple[float, float, float] | None:
    """Two runs' paired speedups compared: exp(trimmed mean(cand) - trimmed mean(base)) and Yuen's
    interval (Welch's t on trimmed means and winsorized variances; Welch's itself below five values a
    side, or with trim 0). None below two values a side."""
    lb, lc = np.asarray(base_logs, dtype=float), np.asarray(cand_logs, dtype=float)
    if min(lb.size, lc.size) < 2:
        return None
    (mb, vb, hb), (mc, vc, hc) = _trimmed(lb, trim), _trimmed(lc, trim)
    diff = mc - mb
    if vb + vc <= 0:
        return float(np.exp(diff)), float(np.exp(diff)), float(np.exp(diff))
    df = (vb + vc) ** 2 / (vb ** 2 / (hb - 1) + vc ** 2 / (hc - 1))
    half = _t_quantile(1 - (1 - level) / 2, df) * np.sqrt(vb + vc)
    return float(np.exp(diff)), float(np.exp(diff - half)), float(np.exp(diff + half))


def welch_log_interval(base_logs, cand_logs, level: float = 0.95) -> tuple[float, float, float] | None:
    """exp(mean(cand) - mean(base)) and Welch's t interval, both sides given as logs (one value per
    independent unit: a repeat's median, a repeat's paired speedup). None below two values a side.
    Yuen's interval with nothing trimmed (the squared standard error is then s^2 / n)."""
    return trimmed_log_interval(base_logs, cand_logs, level, trim=0.0)


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
    # too wide to rule a change of the threshold's size in or out: wider than twice the band from -threshold
    # to +threshold, on the log scale, so the verdict is the same whichever way the ratio is taken (a
    # speedup's 0.84-1.02 is a slowdown's 0.98-1.19); at 5% that is a ratio width of about 0.2
    band = np.log1p(threshold) - np.log1p(-threshold) if threshold < 1 else np.inf
    return "unstable" if np.log(ratio_high / ratio_low) > 2 * band else "no change"


def spread_text(base: list[np.ndarray], cand: list[np.ndarray]) -> str:
    """'repeat medians vary by 7% (baseline) and 14% (candidate)': max / min - 1 within each side."""
    def one(side):
        medians = [float(np.median(x)) for x in side]
        return max(medians) / min(medians) - 1
    return f"repeat medians vary by {one(base):.0%} (baseline) and {one(cand):.0%} (candidate)"


def widen_by_noise(ratio: float, low: float, high: float, floor: float | None) -> tuple[float, float]:
    """Add a series' night-to-night noise (log sd per night; two nights differ by sqrt(2) of it) to
    the interval, in quadrature in log space."""
    return widen_in_quadrature(ratio, low, high, 1.96 * np.sqrt(2) * (floor or 0.0))


def widen_in_quadrature(ratio: float, low: float, high: float, extra: float) -> tuple[float, float]:
    """Each side's log distance from `ratio` and `extra` (log units) added in quadrature; as it was without `extra`."""
    if not extra:
        return low, high
    centre = np.log(ratio)
    lo, hi = centre - np.hypot(centre - np.log(low), extra), centre + np.hypot(np.log(high) - centre, extra)
    return float(np.exp(lo)), float(np.exp(hi))
