"""Change-point detection for nightly series: call a change only when it persists.

A windowed test: each new point is compared with the median of the points before it in the same
regime (at most `window` of them). A change is confirmed when `persist` consecutive points all lie
beyond the band on the same side *and* agree with each other within the band, the band being the
larger of the relative threshold and `k_sigma` standard deviations of the reference (its extreme
points trimmed, so a past spike does not widen it). A one-night spike that reverses never
confirms, and after a confirmed change the new regime becomes the reference.
benchmarks/changepoint_rates.py prints the detection and false-alarm rates on generated series.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ChangePoint:
    index: int  # first point of the new regime
    before: float  # median of the reference window
    after: float  # median of the confirming points
    confirmed_at: int  # index of the point that confirmed it

    @property
    def ratio(self) -> float:
        return self.after / self.before if self.before else float("nan")


def _spread(reference: np.ndarray) -> float:
    ordered = np.sort(reference)
    trimmed = ordered[1:-1] if len(ordered) > 4 else ordered
    return float(np.std(trimmed, ddof=1)) if len(trimmed) > 1 else 0.0


def detect(values, threshold: float = 0.03, window: int = 20, persist: int = 2, k_sigma: float = 3.0,
           min_history: int = 5) -> list[ChangePoint]:
    values = np.asarray(values, dtype=float)
    changes: list[ChangePoint] = []
    start = 0
    i = start + min_history
    while i + persist <= len(values):
        reference = values[max(start, i - window):i]
        median = float(np.median(reference))
        band = max(threshold * abs(median), k_sigma * _spread(reference))
        following = values[i:i + persist]
        beyond = bool(np.all(following > median + band) or np.all(following < median - band))
        if beyond and float(np.ptp(following)) <= band:  # a level shift, not a spike plus an outlier
            changes.append(ChangePoint(i, median, float(np.median(following)), i + persist - 1))
            start = i
            i = start + min_history
            continue
        i += 1
    return changes
