"""A disturbed pair run again: at the end of a run, each repeat of a group in which a mode was stopped as
contended, or ran contended (on_contention: stop), is measured once more, all its modes together (as a
lockstep set where they ran as one), so the retried pair is a pair again; its new rows replace the old.

How much a run with a budget (budget_s) may grow for that: the budget left, or a quarter of what the run took
so far (RETRY_SHARE), whichever is larger. The main job's budget is its windows' share, spent by its end: at
about 100 s with one contended lockstep pair of ResNet-50 (about 10 s) it runs the pair again; with most of
its pairs disturbed it does not grow by half, and says what it left. A run without a budget retries them all.
Under on_contention: flag the user asked for figures however the machine was: nothing is run again.
Torch-free."""
from __future__ import annotations

from amp_bench.store.flags import is_true

RETRY_SHARE = 0.25
CONTENDED = "contended"


def disturbed(row: dict, stops: bool) -> bool:
    """Was this row's measurement disturbed by another process: stopped (or not run) as contended, or, where
    the case stops on contention, measured on a machine its contention check found shared?"""
    if row.get("status") == CONTENDED:
        return True
    return stops and row.get("status") == "ok" and is_true(row.get("contended"))


def pairs_to_retry(measured: list[tuple[tuple, dict]], stops) -> list[list[tuple]]:
    """From (item, row) in run order, where item is (plan index, case, repeat): the items of every repeat of
    a group with a disturbed row, one list per (group, repeat), in run order. `stops(case)`: whether the case
    stops on contention (a flagged row is then disturbed too)."""
    hit = {(case.group_id, repeat) for (_, case, repeat), row in measured if disturbed(row, stops(case))}
    groups: dict[tuple, list[tuple]] = {}
    for item, _ in measured:
        key = (item[1].group_id, item[2])
        if key in hit:
            groups.setdefault(key, []).append(item)
    return list(groups.values())


class Allowance:
    """The seconds a run may still spend on retries: without a budget, any; with one, what is left of it or
    RETRY_SHARE of the run so far, whichever is larger."""

    def __init__(self, elapsed_s: float, budget_left_s: float | None, budgeted: bool = True):
        self.left_s = max(budget_left_s or 0.0, RETRY_SHARE * elapsed_s) if budgeted else float("inf")

    def take(self, cost_s: float | None) -> bool:
        """Spend `cost_s` if it fits (an unknown cost fits while anything is left)."""
        if self.left_s <= 0 or (cost_s is not None and cost_s > self.left_s):
            return False
        self.left_s -= cost_s or 0.0
        return True
