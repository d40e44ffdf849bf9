"""How long a run still has to go, from its plan and the phases its finished workers measured: a later
repeat of a case costs what its earlier repeat cost less the probes (PROBE_PHASES), which later repeats do
not pay; any other case, the median first or later repeat so far; a run budget caps the windows' part, as
BudgetPlanner shares it out. A lockstep member's waits for its partners are their time, not its own, so
the members of a set add up to the set. Torch-free: the progress display asks it after every case."""
from __future__ import annotations

import statistics
import time

from amp_bench.stats import PROBE_PHASES, phase_column

_WINDOW = phase_column("window")


def own_seconds(row: dict) -> float | None:
    """A worker's wall time less its waits for lockstep partners (None when the row has no phases)."""
    wall = row.get("worker_wall_s")
    if not isinstance(wall, (int, float)) or wall != wall:
        return None
    return max(0.0, wall - _number(row, phase_column("wait")))


def _number(row: dict, column: str) -> float:
    value = row.get(column)
    return float(value) if isinstance(value, (int, float)) and value == value else 0.0


class TimeLeft:
    """Fed the plan's (case, repeat) items and every finished row; `seconds()` is the estimate."""

    def __init__(self, items: list, budget_s: float | None = None, clock=time.monotonic):
        self.todo = {(case.case_id, repeat): case for case, repeat in items}
        self.budget_s, self.clock, self.started = budget_s, clock, clock()
        self.later: dict[str, tuple[float, float]] = {}  # case_id -> a later repeat's (fixed s, window s)
        self.firsts: list[float] = []  # first repeats' own seconds, probes included

    def finished(self, case, repeat: int, row: dict) -> None:
        self.todo.pop((case.case_id, repeat), None)
        own = own_seconds(row)
        if own is None:
            return
        window = _number(row, _WINDOW)
        probes = sum(_number(row, phase_column(name)) for name in PROBE_PHASES)
        # what is left of a case is later repeats, which pay none of the probes
        self.later[case.case_id] = (max(0.0, own - window - probes), window)
        if repeat == 0:
            self.firsts.append(own)

    def estimate(self, case, repeat: int) -> float | None:
        """Seconds one more run of this case and repeat should take (None: nothing to go by yet)."""
        found = self._estimate(case, repeat)
        return None if found is None else sum(found)

    def _estimate(self, case, repeat: int) -> tuple[float, float] | None:
        """(fixed s, window s) of a case still to run: a later repeat of a case seen; else the median first
        repeat (for a first repeat) or the median later repeat of the cases seen."""
        if case.case_id in self.later and repeat > 0:
            return self.later[case.case_id]
        if repeat == 0 and self.firsts:
            return statistics.median(self.firsts), 0.0
        later = [fixed + window for fixed, window in self.later.values()]
        return (statistics.median(later), 0.0) if later else None

    def seconds(self) -> float | None:
        """Seconds still to go, or None while some case still to run has nothing to go by."""
        if not self.todo:
            return 0.0
        estimates = [self._estimate(case, repeat) for (_, repeat), case in self.todo.items()]
        if any(e is None for e in estimates):
            return None
        fixed, windows = sum(e[0] for e in estimates), sum(e[1] for e in estimates)
        if self.budget_s is not None:  # the windows share what is left of the budget (BudgetPlanner)
            windows = min(windows, max(0.0, self.budget_s - (self.clock() - self.started)))
        return fixed + windows
