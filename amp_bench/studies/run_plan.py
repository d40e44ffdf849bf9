"""A run's plan: the order its cases run in (repeats interleaved across precisions, so drift hits both sides),
plan.json that the jobs of a SLURM run and `run --resume` run from, the measuring budget spread over it, and
the order cut into launches (a lockstep set, one worker's windows, or one case). Torch-free."""
from __future__ import annotations

import dataclasses
import statistics
import time

from amp_bench.store.results import RunStore
from amp_bench.studies.session import Machine
from amp_bench.suite import Case


def schedule(cases: list[Case]) -> list[tuple[Case, int]]:
    """Group by everything but precision; within a group run repeat 0 of every precision, then
    repeat 1, ... (fp32, amp, fp32, amp): drift then hits both sides, and a group is complete
    before the next starts. Each repeat rotates the order, so no mode always runs first. With
    repeats_per_worker N, the unit is N consecutive repeats of a mode (one worker's windows)."""
    groups: dict[str, list[Case]] = {}
    for case in cases:
        groups.setdefault(case.group_id, []).append(case)
    order = []
    for group in groups.values():
        per_worker = max(1, group[0].repeats_per_worker)
        for turn, start in enumerate(range(0, group[0].repeats, per_worker)):
            shift = turn % len(group)
            chunk = range(start, min(start + per_worker, group[0].repeats))
            order.extend((case, repeat) for case in group[shift:] + group[:shift] for repeat in chunk)
    return order


class BudgetPlanner:
    """Spreads a suite-level time budget (budget_s) over the cases still to run: each gets an equal
    share of what is left, less what a worker costs outside its measured window (start, model
    build, warmup, instrumentation; learnt from the cases so far), as its measuring budget. A case
    never measures fewer than its min_steps, so a budget too small for the suite is overrun, not
    faked."""

    FLOOR_S = 0.5  # the least a case is given to measure in

    def __init__(self, budget_s: float | None, cases: int, clock=time.monotonic):
        self.budget_s, self.remaining, self.clock = budget_s, cases, clock
        self.started = clock()
        self.overheads: list[float] = []

    def plan(self, case):
        if self.budget_s is None:
            return case
        left = self.budget_s - (self.clock() - self.started)
        overhead = statistics.median(self.overheads) if self.overheads else 0.0
        share = max(self.FLOOR_S, left / max(1, self.remaining) - overhead)
        if case.case_budget_s is not None:
            share = min(share, case.case_budget_s)
        return dataclasses.replace(case, case_budget_s=round(share, 3))

    def finished(self, row: dict) -> None:
        self.remaining -= 1
        if row.get("worker_seconds") is not None and row.get("window_s") is not None:
            self.overheads.append(max(0.0, float(row["worker_seconds"]) - float(row["window_s"])))


def make_plan(order: list[tuple[Case, int]], device_type: str, device_request: str) -> dict:
    """plan.json: the cases in the order they run, each with its index (which names its row's part
    file) and log stem. The jobs of a SLURM run and `run --resume` run from it, not from the suite."""
    return {"device_type": device_type, "device_request": device_request,
            "items": [{"index": i, "repeat": repeat, "stem": f"{case.case_id}-r{repeat}", "case": case.to_json()}
                      for i, (case, repeat) in enumerate(order)]}


def plan_order(plan: dict, indices=None) -> list[tuple[int, Case, int]]:
    """(index, case, repeat) of the plan's items (all, or those indices), in plan order."""
    wanted = None if indices is None else set(indices)
    return [(item["index"], Case.from_json(item["case"]), item["repeat"]) for item in plan["items"]
            if wanted is None or item["index"] in wanted]


def part_key(index: int, case: Case, repeat: int) -> str:
    return f"{index:05d}-{case.case_id}-r{repeat}"


def rows_by_index(store: RunStore) -> dict[int, dict]:
    """The rows a run has, by plan index (from their part names)."""
    return {int(key.split("-", 1)[0]): row for key, row in zip(store.part_keys, store.rows, strict=True)
            if key[:5].isdigit()}


def in_lockstep(case: Case, machine: Machine) -> bool:
    """May this case's worker take turns with its repeat's other modes (launchers/lockstep.py)? On the CPU,
    eager, one process, forked from the run's fork server, one repeat a worker, unless the suite says
    `interleave: repeats`."""
    return (case.interleave != "repeats" and machine.device.type == "cpu" and machine.server is not None
            and not case.distributed and not case.compiled and case.repeats_per_worker == 1)


def _one_worker(item, last) -> bool:
    """Is `item` another window of the worker of the unit ending in `last` (repeats_per_worker)?"""
    case, repeat, per_worker = item[1], item[2], max(1, item[1].repeats_per_worker)
    return (last is not None and per_worker > 1 and last[1].case_id == case.case_id and last[2] == repeat - 1
            and last[2] // per_worker == repeat // per_worker)


def launch_units(order: list[tuple[int, Case, int]], machine: Machine, reporter=None) -> list:
    """The order cut into units, each one launch: one repeat's modes of one group together where they may
    run in lockstep (schedule() puts them next to each other), a case's consecutive repeats that share a
    worker (repeats_per_worker), every other item alone. A suite asking for `interleave: steps` where it
    cannot be had is told once why (`reporter`: the run's benchmark.Reporter)."""
    units: list[list] = []
    refused = ""
    for item in order:
        case, repeat = item[1], item[2]
        together = in_lockstep(case, machine)
        if case.interleave == "steps" and not together and not refused:
            refused = (f"interleave: steps needs eager single-process cases on the CPU with forked workers, one "
                       f"repeat a worker; {case.case_id} runs its repeats one worker after another")
        last = units[-1][0] if units else None
        joins_set = together and last is not None and in_lockstep(last[1], machine) and \
            (last[1].group_id, last[2]) == (case.group_id, repeat)
        if joins_set or _one_worker(item, units[-1][-1] if units else None):
            units[-1].append(item)
        else:
            units.append([item])
    if refused and reporter is not None:
        reporter.note(refused)
    return units
