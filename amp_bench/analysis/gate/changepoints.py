"""Change detection for nightly series: where did the level change, and is the latest level worse
than the accepted one?

Everything works on log values oriented so that up is worse (log step time, -log throughput), so a
change is a ratio and the threshold is relative. Two questions, answered separately:

- `segment` / `detect`: the whole history is re-segmented every night (binary segmentation with a
  robust two-sample statistic, then every boundary re-tested against its neighbours, in the spirit
  of E-divisive): a change that later reverts merges away, a level that comes back is seen, and each
  change is dated to the night it began, with the range of nights it may have begun in.
- `state`: is the series red tonight? Red while the latest level (a tail of the last 2..10 nights:
  for two nights the better one, for more the mean with a night 2.5 noise units above all others
  counted as the next worst) sits beyond the accepted level, or the recent window, by at least
  `margin` x the threshold and by a two-sample t-test: the pooled sd of reference and tail nights
  (each around its own level, so a step does not inflate it while a shared machine's slow nights
  do), the t turned into a normal deviate with a discount for a scale learnt from few nights,
  against Z_TAIL by tail length. A tail with a significant drop inside it is a regression and its
  return, not one level; a fixed regression or a reverted spike is green again by itself.
benchmarks/nightly_targets.py prints detection and false-alarm rates on generated series.
"""
from __future__ import annotations

from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

Z_SEGMENT = 4.5  # statistic a split must reach (it is a maximum over positions)
# normal-equivalent bar a red tail must reach, by tail length (2, 3, 4+ nights); with T_DF and
# TEST_FLOOR chosen on generated series (benchmarks/calibrate_state.py prints the trade-off) for the
# fewest pure-noise alarms at which 10% steps are caught within 2 nights and 5% within 3
Z_TAIL = (4.3, 4.3, 3.9)
Z_DROP = 2.5  # a tail with a drop inside it this many noise units deep is not one level (it came back)
MARGIN = 0.75  # ... and at least this share of the threshold
MIN_REFERENCE = 5  # nights of reference before anything can be red
MAX_TAIL = 10  # longest tail tested as "the latest level"
WINDOW = 10  # the rolling window before the tail
SCALE_FLOOR = 0.1  # noise is never taken below this share of the threshold (memory is ~exact)
# the test's noise is never below this share of the threshold: a scale learnt from few nights can
# come out far too quiet, and a quieter machine's threshold-sized step is still > 5 units over 5 nights
TEST_FLOOR = 0.25
T_DF = 2.0  # degrees of freedom per night since the anchor, for the small-sample discount


@dataclass(frozen=True)
class ChangePoint:
    index: int  # first point of the new level
    before: float  # median of the level before (original units)
    after: float  # median of the new level (original units)
    confirmed_at: int  # last point of the new level seen so far
    earliest: int = -1  # range of points the change may have begun at
    latest: int = -1

    @property
    def ratio(self) -> float:
        return self.after / self.before if self.before else float("nan")


@dataclass(frozen=True)
class State:
    red: bool
    start: int = -1  # first night of the current deviation (-1: none)
    earliest: int = -1
    latest: int = -1
    ratio: float = 1.0  # latest level / reference level, in original units
    against: str = ""  # "accepted" or "recent"
    nights: int = 0  # nights in the tail that made the call


def oriented(values, higher_is_worse: bool = True) -> np.ndarray:
    y = np.log(np.asarray(values, dtype=float))
    return y if higher_is_worse else -y


def noise_scale(y: np.ndarray, threshold: float, widen: bool = True) -> float:
    """Night-to-night noise in log units: the RMS of successive differences with the largest tenth
    (at least two) left out, since a step or a spike is one or two differences, over sqrt(2),
    corrected to a normal's standard deviation and widened while there are few nights. Unlike a MAD
    it does not ignore a share of slow nights: a bimodal machine is a noisier machine."""
    floor = SCALE_FLOOR * np.log1p(threshold)
    d = np.sort(np.abs(np.diff(y)))
    if len(d) < 4:
        return floor
    kept = d[:len(d) - max(2, int(round(0.1 * len(d))))]
    p = len(kept) / len(d)
    q = NormalDist().inv_cdf((1 + p) / 2)
    correction = np.sqrt(1 - 2 * q * NormalDist().pdf(q) / p)  # RMS of a normal's central share p
    s = float(np.sqrt(np.mean(kept ** 2) / 2)) / correction
    return max(s * np.sqrt(1 + 4 / len(d)) if widen else s, floor)


def _medfilt3(y: np.ndarray) -> np.ndarray:
    if len(y) < 3:
        return y.copy()
    padded = np.concatenate([y[:1], y, y[-1:]])
    return np.median(np.stack([padded[:-2], padded[1:-1], padded[2:]]), axis=0)


def _profile(seg: np.ndarray, s: float, min_size: int):
    n = len(seg)
    k = np.arange(min_size, n - min_size + 1)
    c = np.cumsum(seg)
    left = c[k - 1] / k
    right = (c[-1] - c[k - 1]) / (n - k)
    return k, np.abs(right - left) / (s * np.sqrt(1 / k + 1 / (n - k))), right - left


def segment(y: np.ndarray, threshold: float = 0.03, z: float = Z_SEGMENT, min_size: int = 2,
            scale: float | None = None) -> list[tuple[int, int, int]]:
    """Change boundaries as (index, earliest, latest), from the whole series."""
    y = np.asarray(y, dtype=float)
    s = scale if scale is not None else noise_scale(y, threshold)
    clean = np.clip(y, _medfilt3(y) - 2.5 * s, _medfilt3(y) + 2.5 * s)  # one-night outliers lose their pull
    effect = 0.5 * np.log1p(threshold)
    found: dict[int, tuple[int, int]] = {}
    stack = [(0, len(y))]
    while stack:
        lo, hi = stack.pop()
        if hi - lo < 2 * min_size:
            continue
        k, t, diff = _profile(clean[lo:hi], s, min_size)
        i = int(np.argmax(t))
        if t[i] < z or abs(diff[i]) < effect:
            continue
        lo_i, hi_i = i, i
        while lo_i - 1 >= 0 and t[lo_i - 1] >= t[i] - 1.0:
            lo_i -= 1
        while hi_i + 1 < len(t) and t[hi_i + 1] >= t[i] - 1.0:
            hi_i += 1
        at = lo + int(k[i])
        found[at] = (lo + int(k[lo_i]), lo + int(k[hi_i]))
        stack += [(lo, at), (at, hi)]
    bounds = sorted(found)
    changed = True
    while changed and bounds:  # re-test each boundary against its neighbours only
        changed = False
        edges = [0, *bounds, len(y)]
        for j in range(1, len(edges) - 1):
            a, b = clean[edges[j - 1]:edges[j]], clean[edges[j]:edges[j + 1]]
            diff = np.median(b) - np.median(a)
            t = abs(np.mean(b) - np.mean(a)) / (s * np.sqrt(1 / len(a) + 1 / len(b)))
            if abs(diff) < effect or t < z - 0.5:
                bounds.remove(edges[j])
                changed = True
                break
    return [(b, *found[b]) for b in bounds]


def detect(values, threshold: float = 0.03, higher_is_worse: bool = True, z: float = Z_SEGMENT,
           min_size: int = 2) -> list[ChangePoint]:
    """Every level change in the series that holds against its neighbours, oldest first."""
    values = np.asarray(values, dtype=float)
    y = oriented(values, higher_is_worse)
    bounds = segment(y, threshold, z, min_size)
    edges = [0, *[b for b, _, _ in bounds], len(values)]
    out = []
    for j, (b, earliest, latest) in enumerate(bounds, start=1):
        before, after = values[edges[j - 1]:edges[j]], values[edges[j]:edges[j + 1]]
        out.append(ChangePoint(b, float(np.median(before)), float(np.median(after)), edges[j + 1] - 1,
                               earliest, latest))
    return out


# sd of the better of two normal nights, x sqrt(2)
_WINSOR_SD2 = 1.168


def _tail_level(tail: np.ndarray, s: float) -> tuple[float, float]:
    """The tail's level and its sd in night units x sqrt(n): for two nights the better night (one
    spike never carries it); for more, the mean with the worst night counted as the second worst
    when it stands 2.5 noise units above it (a spike; a normal tail keeps a plain mean's precision)."""
    if len(tail) == 2:
        return float(tail.min()), _WINSOR_SD2
    srt = np.sort(tail)
    if srt[-1] - srt[-2] > 2.5 * s:
        srt[-1] = srt[-2]
    return float(srt.mean()), 1.0


def _pooled(ref: np.ndarray, r: float, tail: np.ndarray, s: float, floor: float) -> float:
    """The two-sample t-test's pooled sd: reference nights around their level, tail nights around
    theirs, each clipped at 2.5 noise units. A step falls between the two and does not inflate it; a
    shared machine's slow nights do, in both."""
    res = np.concatenate([ref - r, tail - np.median(tail)])
    res = np.clip(res, -2.5 * s, 2.5 * s)
    return max(float(np.sqrt(np.sum(res ** 2) / (len(res) - 2))), floor)


def _normal_equivalent(t: float, df: float) -> float:
    """A Student-t statistic as the normal deviate of about the same tail probability: a scale
    learnt from few nights is discounted (much at 8 nights, little at 30)."""
    return float(np.sign(t) * np.sqrt(df * np.log1p(t * t / df)) * (1 - 1 / (4 * df)))


def _one_level(tail: np.ndarray, s: float) -> bool:
    """False when the tail has a significant drop inside it (at any split, Z_DROP noise units): then
    it is a regression and its return, not one level, and a shorter tail is asked instead."""
    n = len(tail)
    if n < 4:
        return True
    c, k = np.cumsum(tail), np.arange(2, n - 1)
    drop = (c[k - 1] / k - (c[-1] - c[k - 1]) / (n - k)) / (s * np.sqrt(1 / k + 1 / (n - k)))
    return float(drop.max()) <= Z_DROP


def state(values, threshold: float = 0.03, higher_is_worse: bool = True, anchor: int = 0,
          z: float | None = None, margin: float = MARGIN) -> State:
    """Is the latest level worse than the accepted level (the level of the segment that begins at
    `anchor`) or than the recent window before it, beyond the threshold? The latest level is a tail
    of 2..MAX_TAIL nights that does not reach back past the last change in the history (changes in
    the last two nights are not yet a history). z: one bar for every tail length instead of Z_TAIL."""
    y = oriented(values, higher_is_worse)
    n_all = len(y)
    since = y[anchor:] if n_all - anchor >= 6 else y
    # clipping scale: night-to-night differences since the anchor (a step is one difference)
    s = noise_scale(since, threshold, widen=False)
    bounds = [anchor + b for b, _, _ in segment(y[anchor:], threshold, scale=noise_scale(since, threshold))]
    accepted_end = bounds[0] if bounds else n_all
    settled = [b for b in bounds if b <= n_all - 2]  # a boundary in the last night can't cut a 2-night tail
    last = settled[-1] if settled else anchor
    need, consistent = margin * np.log1p(threshold), 0.5 * np.log1p(threshold)
    floor = TEST_FLOOR * np.log1p(threshold)
    df = T_DF * max(n_all - anchor - 1, 1)
    best: State | None = None
    for n in range(2, min(MAX_TAIL, n_all - last) + 1):
        tail_start = n_all - n
        if tail_start <= anchor:
            break
        tail = y[tail_start:]
        if not _one_level(tail, s):
            continue
        level, sd = _tail_level(tail, s)
        bar = z if z is not None else Z_TAIL[min(n, len(Z_TAIL) + 1) - 2]
        accepted = y[anchor:min(accepted_end, tail_start)]
        references = [("accepted", accepted)]
        if len(accepted) < tail_start - anchor or last > anchor:  # else recent is a part of accepted
            references.append(("recent", y[max(last, tail_start - WINDOW):tail_start]))
        for against, ref in references:
            if len(ref) < MIN_REFERENCE:
                continue
            r = _location(ref, s)
            d = level - r
            # beyond margin x the threshold, and the last two nights both past the midpoint
            if d < need or float(np.min(tail[-2:])) - r < max(consistent, d / 2):
                continue
            t = d / (_pooled(ref, r, tail, s, floor) * np.sqrt(sd ** 2 / n + 1 / min(len(ref), 30)))
            if _normal_equivalent(t, df) < bar:
                continue
            if best is None or n > best.nights:
                start, earliest, latest = _date(y, r, d, tail_start, s)
                best = State(True, start, earliest, latest, float(np.exp(d if higher_is_worse else -d)), against, n)
    return best or State(False)


def _location(x: np.ndarray, s: float) -> float:
    """Mean of the values clipped to the median +- 2 noise units (one Huber step)."""
    m = float(np.median(x))
    return float(np.mean(np.clip(x, m - 2 * s, m + 2 * s)))


def _date(y: np.ndarray, reference: float, d: float, tail_start: int, s: float) -> tuple[int, int, int]:
    """The night the deviation began: the first of the final run of nights past the midpoint; the
    range reaches back to the night after the last one still clearly at the reference level."""
    mid = reference + d / 2
    start = len(y) - 1
    while start - 1 >= 0 and y[start - 1] > mid:
        start -= 1
    earliest = start
    while earliest - 1 >= 0 and y[earliest - 1] > reference + s:
        earliest -= 1
    return start, earliest, start
