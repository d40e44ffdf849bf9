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
from amp_bench.studies.run_plan import launch_units

RETRY_SHARE = 0.25
CONTENDED = "contended"


def disturbed(row: dict, stops: bool) -> bool:
    """Was this row's measurement disturbed by another process: stopped (or not run) as contended, or, where
    the case stops on contention, measured on a machine its contention check found shared?"""
    return row.get("status") == CONTENDED or (stops and row.get("status") == "ok" and is_true(row.get("contended")))


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


def retry_disturbed(run, pairs: list[list[tuple]]) -> None:
    """Run each disturbed pair (a group's repeat, every mode: studies/retry.py) once more, as it first ran
    (a lockstep set where it was one), while the machine is quiet (busy.quiet_now over 2 s) and the run's
    retry allowance holds it; the new rows replace the old and say why they were run again. What is not
    run again is said in a note and the manifest. `run`: the run's state (benchmark._Run), whose units run them."""
    from amp_bench.launchers.busy import cores_needed, quiet_now
    if not pairs:
        return
    first = pairs[0][0][1]
    quiet, how = quiet_now(cores_needed(run.machine.device.type, first.threads_per_rank, first.nproc_per_node or 1))
    planner = run.planner
    elapsed = planner.clock() - planner.started
    allowance = Allowance(elapsed, None if planner.budget_s is None else planner.budget_s - elapsed,
                          budgeted=planner.budget_s is not None)
    chosen = [pair for pair in pairs if quiet and allowance.take(_pair_cost(run, pair))]
    left = len(pairs) - len(chosen)
    if left:
        why = how if not quiet else f"the run's retry allowance ({RETRY_SHARE:.0%} of its time, or its budget) is spent"
        run.reporter.note(f"{left} disturbed pair(s) were not run again: {why}")
        run.store.update_manifest(lambda m: m.update(contended_not_retried=f"{left} pair(s): {why}"))
    if not chosen:
        return
    run.reporter.note(f"running {len(chosen)} disturbed pair(s) once more ({how})")
    run.rerun_reasons = {index: _first_words(row) for pair in chosen for index, _, _ in pair
                         if (row := run.rows.get(index)) is not None}
    position = 0
    for pair in chosen:
        for unit in launch_units(pair, run.machine):
            run.unit(unit, position)
            position += len(unit)


def _pair_cost(run, pair: list[tuple]) -> float | None:
    """What running a pair again should take: its cases' estimates (studies/time_left.py)."""
    costs = [run.time_left.estimate(case, repeat) for _, case, repeat in pair] if run.time_left else [None]
    return None if any(c is None for c in costs) else sum(costs)


def _first_words(row: dict) -> str:
    """Why a row was run again: its status and its contention evidence, in one short line."""
    evidence = str(row.get("contention") or row.get("reason") or "")
    return f"{row.get('status')}: {evidence}"[:200]
