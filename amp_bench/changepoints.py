"""Change detection for nightly series: where did the level change, and is the latest level worse
than the accepted one?

Everything works on log values oriented so that up is worse (log step time, -log throughput), so a
change is a ratio and the threshold is relative. Two questions, answered separately:

- `segment` / `detect`: the whole history is re-segmented every night (binary segmentation with a
  robust two-sample statistic, then every boundary re-tested against its neighbours, in the spirit
  of E-divisive): a change that later reverts merges away, a level that comes back is seen, and each
  change is dated to the night it began, with the range of nights it may have begun in.
- `state`: is the series red tonight? Red while the latest level (a tail of the last 2..10 nights,
  its worst night counted as its second worst, so a one-night spike never carries it) sits beyond
  the accepted level, or the recent window, by at least `margin` x the threshold and by Z_TAIL noise
  units (4.5 for a two-night tail, 3.5 for longer ones, which overlap from night to night). A tail
  with a significant drop inside it is a regression and its return, not one level. Noise is a
  trimmed RMS of night-to-night differences since the accepted level, which a step or a spike hardly
  moves but a share of slow nights on a shared machine does raise. A fixed regression or a reverted
  spike is green again by itself.
benchmarks/nightly_targets.py prints detection and false-alarm rates on generated series.
"""
from __future__ import annotations

from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

Z_SEGMENT = 4.5  # statistic a split must reach (it is a maximum over positions)
# noise units a red tail must be beyond its reference, by tail length (2, 3+ nights): two-night tails
# are nearly independent from night to night (the most chances for a false alarm) and only need to
# catch big steps; longer tails overlap from night to night and carry the 3-5% steps
Z_TAIL = (4.5, 3.5, 3.5)
Z_DROP = 2.5  # a tail with a drop inside it this many noise units deep is not one level (it came back)
MARGIN = 0.75  # ... and at least this share of the threshold
MIN_REFERENCE = 5  # nights of reference before anything can be red
MAX_TAIL = 10  # longest tail tested as "the latest level"
WINDOW = 10  # the rolling window before the tail
SCALE_FLOOR = 0.1  # noise is never taken below this share of the threshold (memory is ~exact)


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


def noise_scale(y: np.ndarray, threshold: float) -> float:
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
    return max(s * np.sqrt(1 + 4 / len(d)), floor)


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


# sd of the winsorized mean of n normal nights (worst night counted as the second worst), x sqrt(n)
_WINSOR_SD = {2: 1.168, 3: 1.073, 4: 1.043, 5: 1.032, 6: 1.023, 7: 1.018, 8: 1.016, 9: 1.013, 10: 1.011}


def _tail_level(tail: np.ndarray) -> float:
    """The tail's level: its mean with the worst night counted as the second worst (winsorized), so
    one spike never carries a tail of any length (for two nights it is the better night)."""
    srt = np.sort(tail)
    return float((srt[:-1].sum() + srt[-2]) / len(tail))


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
    # noise: successive differences of the whole series since the anchor (tail included), so a
    # machine with a share of slow nights is seen as the noisier machine it is
    s = noise_scale(y[anchor:] if n_all - anchor >= 6 else y, threshold)
    bounds = [anchor + b for b, _, _ in segment(y[anchor:], threshold, scale=s)]
    accepted_end = bounds[0] if bounds else n_all
    settled = [b for b in bounds if b <= n_all - 2]  # a boundary in the last night can't cut a 2-night tail
    last = settled[-1] if settled else anchor
    need, consistent = margin * np.log1p(threshold), 0.5 * np.log1p(threshold)
    best: State | None = None
    for n in range(2, min(MAX_TAIL, n_all - last) + 1):
        tail_start = n_all - n
        if tail_start <= anchor:
            break
        tail = y[tail_start:]
        if not _one_level(tail, s):
            continue
        level = _tail_level(tail)
        bar = z if z is not None else Z_TAIL[min(n, 4) - 2]
        references = (("accepted", y[anchor:min(accepted_end, tail_start)]),
                      ("recent", y[max(anchor, tail_start - WINDOW):tail_start]))
        for against, ref in references:
            if len(ref) < MIN_REFERENCE:
                continue
            r = _location(ref, s)
            d = level - r
            # beyond margin x the threshold, and the last two nights both past the midpoint
            if d < need or float(np.min(tail[-2:])) - r < max(consistent, d / 2):
                continue
            if d / (s * np.sqrt(_WINSOR_SD[n] ** 2 / n + 1 / min(len(ref), 30))) < bar:
                continue
            if best is None or n > best.nights:
                start, earliest, latest = _date(y, r, d, tail_start, s)
                best = State(True, start, earliest, latest, float(np.exp(d if higher_is_worse else -d)),
                             against, n)
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
