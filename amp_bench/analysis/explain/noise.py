"""How much a category's time moves on its own: the spread that a change must exceed before a
sentence calls it a change, and whether the profiled and the measured speedups agree; torch-free.

Why by hand: the rule is small and specific. Every profiled step is a sample (profile.py takes
several per case; the repeats of a case are pooled), so a category's spread is what it does from
step to step and from process to process: the 10th to 90th percentile with ten samples or more,
else min to max. Samples from one process alone cannot see process-to-process drift (6-15% in the
median on this project's VMs, docs/sources.md), so such a spread is widened to at
least PROCESS_FLOOR either side of the median.
A category changed when the two modes' spreads do not overlap; a speedup's interval is
[base low / mode high, base high / mode low]. The profiled and the measured speedups disagree when
their intervals do not overlap; then the breakdown does not explain the measurement.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass

PROCESS_FLOOR = 0.075  # half of the 15% that same-code processes differed by (docs/sources.md)


@dataclass
class Spread:
    median: float
    low: float
    high: float
    n: int

    def half_width(self) -> float:
        """The spread's relative half-width around the median, for saying it ('±8%')."""
        return (self.high - self.low) / 2 / self.median if self.median > 0 else 0.0


def _quantile(sorted_values: list[float], q: float) -> float:
    position = q * (len(sorted_values) - 1)
    below = int(position)
    above = min(below + 1, len(sorted_values) - 1)
    return sorted_values[below] + (sorted_values[above] - sorted_values[below]) * (position - below)


def spread(samples: list[float], processes: int = 1) -> Spread | None:
    """Median and spread of per-step samples (ms) pooled from `processes` processes."""
    values = sorted(float(v) for v in samples if v is not None and v == v)
    if not values:
        return None
    median = statistics.median(values)
    low, high = (_quantile(values, 0.1), _quantile(values, 0.9)) if len(values) >= 10 else (values[0], values[-1])
    if processes <= 1:
        low, high = min(low, median * (1 - PROCESS_FLOOR)), max(high, median * (1 + PROCESS_FLOOR))
    return Spread(median, low, high, len(values))


def changed(base: Spread | None, mode: Spread | None) -> bool:
    """True when the mode's time is outside the baseline's spread and the baseline's outside the mode's."""
    return base is not None and mode is not None and (mode.high < base.low or mode.low > base.high)


def speedup_interval(base: Spread | None, mode: Spread | None) -> tuple[float, float] | None:
    if base is None or mode is None or mode.low <= 0 or mode.high <= 0:
        return None
    return base.low / mode.high, base.high / mode.low


def disagree(a: tuple[float, float] | None, b: tuple[float, float] | None) -> bool:
    """Two speedup intervals that do not overlap."""
    return a is not None and b is not None and (a[1] < b[0] or b[1] < a[0])


def summed(samples: dict[str, list[float]], keys) -> list[float]:
    """Per-step sums of several categories (their lists are aligned step by step)."""
    lists = [samples.get(k) or [] for k in keys]
    length = max((len(v) for v in lists), default=0)
    return [sum(v[i] for v in lists if i < len(v)) for i in range(length)]
