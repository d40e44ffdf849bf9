"""Step timers and the statistics of a window of step times.

CPU: perf_counter per step. CUDA: a pair of CUDA events per step (GPU time, no sync inside the
loop) plus one synchronised wall-clock window for throughput. The CUDA calls come in through the
constructor so the logic is tested on a CPU with fake events.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import Callable

import numpy as np

UNSTABLE_CV = 0.10  # pyperf warns when stdev >= 10% of the mean


@dataclass(frozen=True)
class StepStats:
    """Summary of per-step times in milliseconds (a value object, like optimum-benchmark's Latency)."""
    n: int
    median: float
    mean: float
    p10: float
    p90: float
    iqr: float
    cv: float
    min: float
    max: float

    @classmethod
    def from_samples(cls, samples_ms: list[float]) -> StepStats:
        if not samples_ms:
            raise ValueError("no step times to summarise")
        a = np.asarray(samples_ms, dtype=float)
        mean = float(a.mean())
        std = float(a.std(ddof=1)) if a.size > 1 else 0.0
        q10, q25, q50, q75, q90 = np.percentile(a, [10, 25, 50, 75, 90])
        return cls(n=int(a.size), median=float(q50), mean=mean, p10=float(q10), p90=float(q90),
                   iqr=float(q75 - q25), cv=std / mean if mean > 0 else math.nan,
                   min=float(a.min()), max=float(a.max()))

    def instability(self) -> str | None:
        """A pyperf-style warning, or None when the window looks stable."""
        if self.cv >= UNSTABLE_CV:
            return (f"unstable: step-time CV is {self.cv:.0%} (>= {UNSTABLE_CV:.0%}); "
                    "results may not be reproducible — more steps, warmup or a quieter machine help")
        if self.n >= 5 and (self.min < 0.5 * self.mean or self.max > 1.5 * self.mean):
            return (f"unstable: step times range {self.min:.3g}-{self.max:.3g} ms around a mean of "
                    f"{self.mean:.3g} ms (more than 50% off)")
        return None

    def to_columns(self, prefix: str = "step_time_ms") -> dict[str, float]:
        data = asdict(self)
        data.pop("n")
        out = {f"{prefix}_{k}": v for k, v in data.items()}
        out["step_time_cv"] = out.pop(f"{prefix}_cv")
        return out


MEASURED_PHASE = "measure"  # a timed step; warmup steps never enter a figure


def measured(samples):
    """The timed steps among per-step samples: a DataFrame (rows of the samples table) or a list
    of sample dicts (a worker record's). The one definition of "the measured samples"."""
    if hasattr(samples, "loc"):
        return samples[(samples["phase"] == MEASURED_PHASE) & samples["step_time_ms"].notna()]
    return [s for s in samples if s.get("phase") == MEASURED_PHASE and s.get("step_time_ms") is not None]


def samples_per_second(samples: float, seconds: float) -> float | None:
    """Throughput: training samples processed (batch x steps x processes) over the seconds it took.
    The one throughput formula: the worker's window, DDP aggregation, ingest and compare use it."""
    if not seconds or seconds <= 0 or not math.isfinite(seconds):
        return None
    return samples / seconds


@dataclass(frozen=True)
class Window:
    """A measured window: per-step times, the wall-clock seconds around them (host gaps included),
    and how many samples each step processed across every process."""
    step_times_ms: tuple[float, ...]
    seconds: float
    batch_size: int
    world_size: int = 1

    @classmethod
    def from_steps(cls, step_times_ms, batch_size: int, seconds: float | None = None,
                   world_size: int = 1) -> Window:
        """`seconds` defaults to the sum of the steps (no gap measured, e.g. pytest-benchmark rounds)."""
        times = tuple(float(t) for t in step_times_ms)
        return cls(times, sum(times) / 1e3 if seconds is None else float(seconds), int(batch_size), int(world_size))

    @property
    def stats(self) -> StepStats:
        return StepStats.from_samples(list(self.step_times_ms))

    @property
    def throughput(self) -> float | None:
        return samples_per_second(self.world_size * self.batch_size * len(self.step_times_ms), self.seconds)

    @property
    def gap_fraction(self) -> float | None:
        """Share of the window outside every step: host work between steps (or, on CUDA, the GPU
        idling while the host catches up)."""
        if not self.seconds or self.seconds <= 0:
            return None
        return max(0.0, 1 - sum(self.step_times_ms) / 1e3 / self.seconds)

    def to_columns(self) -> dict:
        return {**self.stats.to_columns(), "window_s": self.seconds, "throughput": self.throughput,
                "window_gap_fraction": self.gap_fraction}


class CpuStepTimer:
    """Host clock; on the CPU the step is synchronous, so this is the step's real duration."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self._clock = clock
        self._starts: list[float] = []
        self._ends: list[float] = []
        self._window: tuple[float, float] | None = None

    def begin_window(self) -> None:
        self._window = (self._clock(), math.nan)

    def step_started(self) -> None:
        self._starts.append(self._clock())

    def step_ended(self) -> None:
        self._ends.append(self._clock())

    def end_window(self) -> tuple[list[float], float]:
        end = self._clock()
        start = self._window[0]
        per_step = [(e - s) * 1e3 for s, e in zip(self._starts, self._ends)]
        return per_step, end - start


class CudaStepTimer:
    """CUDA events around each step (no host sync inside the loop), and a wall-clock window
    bracketed by device synchronisations for throughput. torch creates a CUDA event lazily on its
    first record(), so every event is recorded once before the window: the loop then only re-records."""

    def __init__(self, event_factory: Callable[[], object], synchronize: Callable[[], None], steps: int,
                 clock: Callable[[], float] = time.perf_counter):
        self._synchronize = synchronize
        self._clock = clock
        self._starts = [event_factory() for _ in range(steps)]
        self._ends = [event_factory() for _ in range(steps)]
        self._recorded = 0
        self._window_start = math.nan

    def begin_window(self) -> None:
        for event in self._starts + self._ends:
            event.record()
        self._synchronize()
        self._window_start = self._clock()

    def step_started(self) -> None:
        self._starts[self._recorded].record()

    def step_ended(self) -> None:
        self._ends[self._recorded].record()
        self._recorded += 1

    def end_window(self) -> tuple[list[float], float]:
        self._synchronize()
        window = self._clock() - self._window_start
        pairs = zip(self._starts[: self._recorded], self._ends[: self._recorded])
        return [start.elapsed_time(end) for start, end in pairs], window
