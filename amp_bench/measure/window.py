"""Step timers and the statistics of a window of step times.

CPU: perf_counter per step. CUDA: a pair of CUDA events per step (GPU time, no sync inside the
loop) plus one synchronised wall-clock window for throughput. The CUDA calls come in through the
constructor so the logic is tested on a CPU with fake events.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from amp_bench.stats import MIN_CI_SAMPLES, relative_half_width


def host_clock() -> float:
    """The host clock the CPU timer and the window read. Tests replace CLOCK (a model that advances a
    fake clock gives step times that no busy machine can disturb)."""
    return CLOCK()


CLOCK: Callable[[], float] = time.perf_counter


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
        return "budget" if self.over_budget(n, elapsed_s) else None


def stop_rule(case, rank=None):
    """The case's window: adaptive (target_ci and/or budget between min_steps and max_steps) or a
    fixed number of steps. DDP ranks must take the same number of steps (every step is a
    collective), so a distributed case always measures a fixed count."""
    if rank is not None or (case.target_ci is None and case.case_budget_s is None):
        return StopRule.fixed(case.steps)
    return StopRule(case.min_steps, case.max_steps, case.target_ci, case.case_budget_s)


class WindowTimes(NamedTuple):
    per_step_ms: list[float]
    window_s: float
    stop_reason: str  # precision reached, budget, max steps, fixed steps


def measure_window(run_step, timer, rule, on_step=lambda i: None, before_end=lambda: None, baton=None) -> WindowTimes:
    """Time steps until the rule says stop: (per-step ms, window seconds, why it stopped).
    The CPU timer has every step's time at once; CUDA events are read (one synchronisation) only
    at checkpoints, about ten times a window, so the GPU queue stays full in between. `before_end`
    runs after the last step is launched and before the closing synchronisation (the NVML sampler
    stops there: once the queue drains the GPU idles, and a late sample would report gpu_idle).
    `baton` (a lockstep member's, measure/baton.py; CPU only): between steps, once a turn is over, the
    timer pauses while the other members take theirs; the window's seconds and the budget are this
    member's own turns."""
    timer.begin_window()
    n, next_check, reason = 0, rule.min_steps, None
    while reason is None:
        if baton is not None and n and baton.turn_over():
            timer.pause()
            baton.pass_turn()
            timer.resume()
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
    return WindowTimes(*timer.end_window(), reason)


class CpuStepTimer:
    """Host clock; on the CPU the step is synchronous, so this is the step's real duration."""

    cheap_times = True  # times_so_far() costs nothing: a stop rule may look after every step

    def __init__(self, clock: Callable[[], float] = host_clock):
        self._clock = clock
        self._starts: list[float] = []
        self._ends: list[float] = []
        self._window: tuple[float, float] | None = None
        self._paused_s, self._paused_at = 0.0, None  # a lockstep member's time without the baton

    def begin_window(self) -> None:
        self._window = (self._clock(), math.nan)

    def pause(self) -> None:
        self._paused_at = self._clock()

    def resume(self) -> None:
        self._paused_s += self._clock() - self._paused_at
        self._paused_at = None

    def step_started(self) -> None:
        self._starts.append(self._clock())

    def step_ended(self) -> None:
        self._ends.append(self._clock())

    def times_so_far(self) -> list[float]:
        return [(e - s) * 1e3 for s, e in zip(self._starts, self._ends, strict=False)]

    def elapsed_s(self) -> float:
        return self._clock() - self._window[0] - self._paused_s

    def end_window(self) -> tuple[list[float], float]:
        window_s = self.elapsed_s()
        return self.times_so_far(), window_s


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
        pairs = zip(self._starts[: self._recorded], self._ends[: self._recorded], strict=True)
        return [start.elapsed_time(end) for start, end in pairs]

    def end_window(self) -> tuple[list[float], float]:
        self._synchronize()
        window = self._clock() - self._window_start
        pairs = zip(self._starts[: self._recorded], self._ends[: self._recorded], strict=True)
        return [start.elapsed_time(end) for start, end in pairs], window
