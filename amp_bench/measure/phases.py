"""Where a worker's wall time goes: contiguous phases from its launch (the parent's clock, handed down as
AMP_BENCH_LAUNCHED_AT) to its result, each closed by `mark` as the next begins, so nothing between two
marks goes uncounted (stats.WORKER_PHASES names them). The parent adds the last one, `exit`, from its reap.

Wall-clock time (time.time) rather than a monotonic clock: the launch is read in another process. A
lockstep member's waits for its partners' turns are taken out of whichever phase they fell in and
counted as `wait`, so each phase is the member's own time. Torch-free."""
from __future__ import annotations

import os
import time

from amp_bench.stats import WORKER_PHASES, phase_column

LAUNCHED_ENV = "AMP_BENCH_LAUNCHED_AT"  # the parent's time.time() as it started this worker (process.worker_env)


class PhaseClock:
    def __init__(self, launched_at: float | None = None, clock=time.time):
        self.clock = clock
        self.last = launched_at if launched_at is not None else clock()
        self.seconds: dict[str, float] = {}
        self.waited = lambda: 0.0  # cumulative seconds spent waiting for turns (a lockstep member's baton)
        self._waited_at_last = 0.0

    @classmethod
    def from_env(cls, environ=None) -> PhaseClock:
        launched = (os.environ if environ is None else environ).get(LAUNCHED_ENV, "")
        try:
            return cls(float(launched))
        except ValueError:
            return cls()

    def mark(self, name: str) -> None:
        """Close phase `name` now: the time since the last mark is its (added to what it had)."""
        if name not in WORKER_PHASES:
            raise ValueError(f"unknown worker phase {name!r}")
        now, waited = self.clock(), self.waited()
        wait = max(0.0, waited - self._waited_at_last)
        self.seconds[name] = self.seconds.get(name, 0.0) + max(0.0, now - self.last - wait)
        if wait:
            self.seconds["wait"] = self.seconds.get("wait", 0.0) + wait
        self.last, self._waited_at_last = now, waited

    def hand_off(self) -> float:
        """The time since the last mark, taken out of this worker's phases for a row of its own (a later
        repeat's window measured by the same worker): returned, and the clock moves on."""
        now = self.clock()
        seconds, self.last = max(0.0, now - self.last), now
        self._waited_at_last = self.waited()
        return seconds

    def columns(self) -> dict:
        """The phases so far as row columns (every phase present; 0 where none ran), and when they ended."""
        return {**{phase_column(name): round(self.seconds.get(name, 0.0), 4) for name in WORKER_PHASES
                   if name != "exit"}, "worker_ended_at": self.last}
