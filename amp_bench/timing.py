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
MIN_CI_SAMPLES = 6  # below this no pair of order statistics covers the median with 95% confidence


def host_clock() -> float:
    """The host clock the CPU timer and the window read. Tests replace CLOCK (a model that advances a
    fake clock gives step times that no busy machine can disturb)."""
    return CLOCK()


CLOCK: Callable[[], float] = time.perf_counter


def median_ci(samples_ms, confidence: float = 0.95) -> tuple[float, float]:
    """Distribution-free confidence interval of the median: the pair of order statistics that covers
    the population median with at least `confidence` (binomial(n, 1/2) ranks). Makes no normality
    assumption, so a skewed step-time distribution (the usual shape) is fine. Fewer than
    MIN_CI_SAMPLES samples: (min, max), which is then no 95% interval, and stop rules don't trust it."""
    a = np.sort(np.asarray(samples_ms, dtype=float))
    n = a.size
    if n == 0:
        raise ValueError("no step times for an interval")
    if n < MIN_CI_SAMPLES:
        return float(a[0]), float(a[-1])
    from scipy.stats import binom
    alpha = 1 - confidence
    # the largest m with P(Bin(n, 1/2) <= m) <= alpha/2: then [x_(m), x_(n-1-m)] (0-based) covers the
    # median with probability 1 - 2 P(Bin <= m) >= confidence
    m = int(binom.ppf(alpha / 2, n, 0.5))
    if binom.cdf(m, n, 0.5) > alpha / 2:
        m -= 1
    j = max(m, 0)
    k = n - 1 - j
    return float(a[j]), float(a[k])


@dataclass(frozen=True)
class StopRule:
    """When a measured window is long enough: fixed `steps`, or adaptively, once the 95% interval of
    the median is within +-target_ci of it, the budget is spent, or max_steps is reached (never
    before min_steps)."""
    min_steps: int
    max_steps: int
    target_ci: float | None = None  # relative half-width; None: a fixed number of steps (max_steps)
    budget_s: float | None = None  # seconds of measuring

    @classmethod
    def fixed(cls, steps: int) -> StopRule:
        return cls(steps, steps)

    @property
    def adaptive(self) -> bool:
        return self.target_ci is not None or self.budget_s is not None

    def over_budget(self, steps: int, elapsed_s: float) -> bool:
        return self.budget_s is not None and steps >= self.min_steps and elapsed_s >= self.budget_s

    def reason_to_stop(self, samples_ms: list[float], elapsed_s: float) -> str | None:
        """None to go on, else why the window ends: 'fixed steps', 'max steps', 'precision reached',
        'budget'."""
        n = len(samples_ms)
        if not self.adaptive:
            return "fixed steps" if n >= self.max_steps else None
        if n >= self.max_steps:
            return "max steps"
        if n < self.min_steps:
            return None
        if self.target_ci is not None and n >= MIN_CI_SAMPLES and relative_half_width(samples_ms) <= self.target_ci:
            return "precision reached"
        if self.over_budget(n, elapsed_s):
            return "budget"
        return None


def relative_half_width(samples_ms) -> float:
    """Half the width of the median's 95% interval, relative to the median."""
    low, high = median_ci(samples_ms)
    median = float(np.median(samples_ms))
    return (high - low) / 2 / median if median > 0 else math.inf


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


def stop_rule(case, rank=None):
    """The case's window: adaptive (target_ci and/or budget between min_steps and max_steps) or a
    fixed number of steps. DDP ranks must take the same number of steps (every step is a
    collective), so a distributed case always measures a fixed count."""
    if rank is not None or (case.target_ci is None and case.case_budget_s is None):
        return StopRule.fixed(case.steps)
    return StopRule(case.min_steps, case.max_steps, case.target_ci, case.case_budget_s)


def measure_window(run_step, timer, rule, on_step=lambda i: None,
                   before_end=lambda: None) -> tuple[list[float], float, str]:
    """Time steps until the rule says stop: (per-step ms, window seconds, why it stopped).
    The CPU timer has every step's time at once; CUDA events are read (one synchronisation) only
    at checkpoints, about ten times a window, so the GPU queue stays full in between. `before_end`
    runs after the last step is launched and before the closing synchronisation (the NVML sampler
    stops there: once the queue drains the GPU idles, and a late sample would report gpu_idle)."""
    timer.begin_window()
    n, next_check, reason = 0, rule.min_steps, None
    while reason is None:
        timer.step_started()
        run_step()
        timer.step_ended()
        on_step(n)
        n += 1
        if n >= rule.max_steps:
            reason = "max steps" if rule.adaptive else "fixed steps"
        elif rule.adaptive and n >= next_check:
            # the interval (a sort and a binomial quantile) only at checkpoints: it runs inside the
            # window, between steps, where per-step work would show up as host gap
            reason = rule.reason_to_stop(timer.times_so_far(), timer.elapsed_s())
            next_check = n + max(5, n // 10)
        elif rule.adaptive and timer.cheap_times and rule.over_budget(n, timer.elapsed_s()):
            reason = "budget"  # a clock read: the CPU window ends on the step that spends the budget
    before_end()
    per_step_ms, window_s = timer.end_window()
    return per_step_ms, window_s, reason


class CpuStepTimer:
    """Host clock; on the CPU the step is synchronous, so this is the step's real duration."""

    cheap_times = True  # times_so_far() costs nothing: a stop rule may look after every step

    def __init__(self, clock: Callable[[], float] = host_clock):
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

    def times_so_far(self) -> list[float]:
        return [(e - s) * 1e3 for s, e in zip(self._starts, self._ends)]

    def elapsed_s(self) -> float:
        return self._clock() - self._window[0]

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
                 clock: Callable[[], float] = host_clock):
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

    cheap_times = False  # reading events needs a synchronisation

    def elapsed_s(self) -> float:
        return self._clock() - self._window_start

    def times_so_far(self) -> list[float]:
        """Synchronises (a checkpoint): the adaptive stop rule reads this every few steps only."""
        self._synchronize()
        pairs = zip(self._starts[: self._recorded], self._ends[: self._recorded])
        return [start.elapsed_time(end) for start, end in pairs]

    def end_window(self) -> tuple[list[float], float]:
        self._synchronize()
        window = self._clock() - self._window_start
        pairs = zip(self._starts[: self._recorded], self._ends[: self._recorded])
        return [start.elapsed_time(end) for start, end in pairs], window
