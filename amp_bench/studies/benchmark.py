"""Orchestration of a benchmark run: suite -> cases -> one worker per case and repeat -> results store.

What is measured lives in measure/; where and how one case runs, in launchers/ (launch.py, process.py);
the opening every study shares, in session.py. This module decides the order (repeats interleaved
across precisions so drift hits both sides), writes it down as the run's plan, and runs cases from it
(run_cases: the local run, each SLURM job of studies/cluster.py and `run --resume` alike), keeping the
store up to date after every case.
"""
from __future__ import annotations

import dataclasses
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from amp_bench.analysis.explain.judge import explain_row
from amp_bench.errors import UserError
from amp_bench.launchers.forkserver import ForkServer
from amp_bench.launchers.launch import BUSY_LOOK_S, base_row, run_one, run_shared, still_busy, stops_on_contention
from amp_bench.launchers.lockstep import INTERLEAVE_COLUMN, run_lockstep
from amp_bench.platform.device import DeviceInfo, may_run, precision_support
from amp_bench.store.flags import is_true
from amp_bench.store.results import RESULT_COLUMNS, RunStore, order_columns, read_table, utc_now
from amp_bench.store.run_state import RERUN_STATUSES, Heartbeat, run_state
from amp_bench.studies.flop_counts import FlopCounts
from amp_bench.studies.retry import RETRY_SHARE, Allowance, pairs_to_retry
from amp_bench.studies.session import Session, probe, record_machine, running, server_for, spawn_note
from amp_bench.studies.time_left import TimeLeft
from amp_bench.suite import Case


class Reporter:
    """Progress callbacks; the CLI renders them with rich, the API stays quiet."""

    def run_started(self, store: RunStore, device: DeviceInfo, total: int) -> None: ...
    def case_started(self, case: Case, repeat: int, index: int, total: int) -> None: ...
    def worker_event(self, case: Case, event: dict) -> None: ...
    def case_finished(self, case: Case, row: dict) -> None: ...
    def time_left(self, seconds: float | None) -> None: ...  # the run's estimate (studies/time_left.py)
    def note(self, text: str) -> None: ...


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
    return {int(key.split("-", 1)[0]): row for key, row in zip(store.part_keys, store.rows) if key[:5].isdigit()}


@dataclass
class Machine:
    """Where the cases run, as the rows record it: the device, versions, host and fingerprint columns,
    and (in a SLURM job) the job's columns."""
    device: DeviceInfo
    versions: dict
    hostname: str
    fingerprint: dict
    columns: dict = field(default_factory=dict)
    server: ForkServer | None = None  # the run's fork server: how its workers start (None: fresh interpreters)


# After this many contended cases in a row, each next case first asks whether the machine is still busy
# (half a second of /proc/stat, BUSY_LOOK_S) and is saved as contended, not run, while it is: a worker
# started on a machine that stays busy only waits out the watch's hold (3 s) to be stopped, and a
# 40-repeat smoke suite beside three spinning processes would spend over 8 minutes saying so case by case.
BUSY_STREAK = 4
# run_suite rewrites results.csv and samples.csv at most this often (RunStore.flush_every_s): each
# rewrite builds the whole table, which on a 320-row smoke run had grown to ~0.1 s a case. Every row's
# part is on disk when its case ends; the tables catch up at the run's end and for any reader.
TABLES_EVERY_S = 2.0


def run_cases(store: RunStore, order: list[tuple[int, Case, int]], machine: Machine, reporter: Reporter,
              stop=None, heartbeat=None, units: list[list] | None = None) -> None:
    """Run cases one after another, each in a fresh worker (a repeat's modes together as a lockstep set
    where launch_units says so), and save each row as it finishes. `stop` (a job's StopSignals) ends the
    loop at a signal: the case it cut short, and those not started, get rows saying why (a died status);
    `heartbeat` is told which case runs. A repeat of a group whose measurement another process disturbed
    (a mode stopped as contended, not run while the machine stayed busy (BUSY_STREAK), or measured on a
    shared machine where the case stops on contention) is run once more at the end, all its modes, if the
    machine is quiet then and the run's retry allowance holds it (retry_disturbed)."""
    info = machine.device
    # the hardware gate, decided once per planned case; the worker is handed the decision
    supports = {index: precision_support(case.precision, info) for index, case, _ in order}
    runnable = {index for index, case, _ in order if may_run(supports[index], case.allow_emulated)}
    budget_s = order[0][1].budget_s if order else None
    run = _Run(store, machine, reporter, supports, runnable, BudgetPlanner(budget_s, len(runnable)), stop, heartbeat,
               len(order), time_left=TimeLeft([(c, r) for i, c, r in order if i in runnable], budget_s))
    measured, streak, position = [], 0, 0
    for unit in units or launch_units(order, machine, reporter):  # `units`: a caller's own (run --try's pairs)
        if stop is not None and stop.requested:
            _save_died(store, order[position:], machine, stop)
            return
        live = [item for item in unit if item[0] in runnable]
        evidence = still_busy(live[0][1], info) if streak >= BUSY_STREAK and live else ""
        rows = run.unit(unit, live, position, evidence, streak)
        if rows is None:  # a stop cut it short: what it had not saved, and the rest, are saved as died
            _save_died(store, [item for item in order[position:] if item[0] not in run.saved], machine, stop,
                       running=run.running)
            return
        for (index, case, repeat), row in zip(unit, rows):
            if index in runnable:
                measured.append(((index, case, repeat), row))
                streak = streak + 1 if row["status"] == "contended" or is_true(row.get("contended")) else 0
        position += len(unit)
    if not (stop is not None and stop.requested):
        retry_disturbed(run, pairs_to_retry(measured, stops_on_contention))


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


def launch_units(order: list[tuple[int, Case, int]], machine: Machine, reporter: Reporter | None = None) -> list:
    """The order cut into units, each one launch: one repeat's modes of one group together where they may
    run in lockstep (schedule() puts them next to each other), a case's consecutive repeats that share a
    worker (repeats_per_worker), every other item alone. A suite asking for `interleave: steps` where it
    cannot be had is told once why."""
    units: list[list] = []
    refused = ""
    for item in order:
        case, repeat = item[1], item[2]
        together = in_lockstep(case, machine)
        if case.interleave == "steps" and not together and not refused:
            refused = (f"interleave: steps needs eager single-process cases on the CPU with forked workers, one "
                       f"repeat a worker; {case.case_id} runs its repeats one worker after another")
        last = units[-1][0] if units else None
        if together and last is not None and in_lockstep(last[1], machine) and \
                (last[1].group_id, last[2]) == (case.group_id, repeat):
            units[-1].append(item)
        elif _one_worker(item, units[-1][-1] if units else None):
            units[-1].append(item)
        else:
            units.append([item])
    if refused and reporter is not None:
        reporter.note(refused)
    return units


def _save_busy(store: RunStore, item, machine: Machine, reporter: Reporter, evidence: str, streak: int) -> dict:
    """The row of a case not run because the machine was still busy after `streak` contended cases."""
    text = (f"not run: the machine was still busy ({evidence} over {BUSY_LOOK_S:g} s, after {streak} contended "
            "cases in a row)")
    row = _save_unrun(store, item, machine, status="contended", reason=text, contended=True, contention=text)
    reporter.case_finished(item[1], row)
    return row


@dataclass
class _Run:
    """What every unit of a run shares: where rows go, the machine, the gate's decisions, the budget."""
    store: RunStore
    machine: Machine
    reporter: Reporter
    supports: dict
    runnable: set
    planner: BudgetPlanner
    stop: object
    heartbeat: object
    total: int
    running: set = field(default_factory=set)  # plan indexes whose workers run now
    saved: set = field(default_factory=set)  # plan indexes whose rows are saved
    time_left: TimeLeft | None = None  # the estimate the progress display shows
    flops: FlopCounts = field(default_factory=FlopCounts)  # FLOPs counted once per model, batch and layout
    rows: dict = field(default_factory=dict)  # plan index -> its saved row
    rerun_reasons: dict = field(default_factory=dict)  # plan index -> why it runs again (retry_disturbed)

    def unit(self, unit: list, live: list, position: int, evidence: str, streak: int) -> list[dict] | None:
        """One unit's rows in plan order (None when a job's stop cut it short): not run while the machine
        stays busy (`evidence`), a lockstep set, one worker's windows, or its one item."""
        if evidence:
            return [_save_busy(self.store, item, self.machine, self.reporter, evidence, streak)
                    if item in live else self.item(item, position + n) for n, item in enumerate(unit)]
        if len(live) < 2:
            rows = []
            for n, item in enumerate(unit):
                rows.append(self.item(item, position + n))
                if rows[-1] is None:
                    return None
            return rows
        one_case = len({case.case_id for _, case, _ in live}) == 1
        measured = self.one_worker(live, position) if one_case else self.lockstep(unit, live, position)
        if measured is None:
            return None
        return [self.save(item, *measured[item[0]]) if item in live else self.item(item, position + n)
                for n, item in enumerate(unit)]

    def item(self, item, position: int, note: str = "") -> dict | None:
        """One planned case in its worker, judged and saved; None when a job's stop cut it short."""
        index, case, repeat = item
        runs = index in self.runnable
        case = self.flops.assign(self.planner.plan(case)) if runs else case
        self.reporter.case_started(case, repeat, position, self.total)
        if self.heartbeat is not None:
            self.heartbeat.set(case=f"{case.case_id} r{repeat}")
        self.running = {index} if runs else set()
        measured = self._guarded(runs, lambda: run_one(
            case, repeat, self.machine.device, self.machine.versions, self.store, self.supports[index],
            on_event=lambda event, case=case: self.reporter.worker_event(case, event), server=self.machine.server))
        if measured is None:
            return None
        row, samples = measured
        if self.stop is not None and self.stop.requested and runs and row["status"] != "ok":
            return None  # the signal reached the worker first (SLURM signals the whole job): its death is the stop's
        row.setdefault(INTERLEAVE_COLUMN, "repeats" if runs else None)
        return self.save((index, case, repeat), row, samples, note)

    def lockstep(self, unit: list, live: list, position: int) -> dict | None:
        """The live items of a unit as one lockstep set: {index: (row, samples)}, None on a job's stop."""
        planned = [(index, self.flops.assign(self.planner.plan(case)), repeat) for index, case, repeat in live]
        for index, case, repeat in planned:
            self.reporter.case_started(case, repeat, position + [i for i, _, _ in unit].index(index), self.total)
        if self.heartbeat is not None:
            self.heartbeat.set(case=", ".join(f"{case.case_id} r{repeat}" for _, case, repeat in planned))
        self.running = {index for index, _, _ in planned}
        measured = self._guarded(True, lambda: run_lockstep(
            [(case, repeat, f"{case.case_id}-r{repeat}") for _, case, repeat in planned], self.machine.device,
            self.machine.versions, self.store, [self.supports[index] for index, _, _ in planned],
            on_event=self.reporter.worker_event, server=self.machine.server))
        if measured is None:
            return None
        if self.stop is not None and self.stop.requested and any(row["status"] != "ok" for row, _ in measured):
            return None
        return {index: found for (index, _, _), found in zip(planned, measured)}

    def one_worker(self, live: list, position: int) -> dict | None:
        """Consecutive repeats of one case as windows of one worker: {index: (row, samples)}, None on a stop."""
        case = self.flops.assign(self.planner.plan(live[0][1]))
        self.reporter.case_started(case, live[0][2], position, self.total)
        if self.heartbeat is not None:
            self.heartbeat.set(case=f"{case.case_id} r{live[0][2]}-{live[-1][2]}")
        self.running = {index for index, _, _ in live}
        measured = self._guarded(True, lambda: run_shared(
            case, [repeat for _, _, repeat in live], self.machine.device, self.machine.versions, self.store,
            self.supports[live[0][0]], on_event=lambda event: self.reporter.worker_event(case, event),
            server=self.machine.server))
        if measured is None or (self.stop is not None and self.stop.requested and
                                any(row["status"] != "ok" for row, _ in measured)):
            return None
        for row, _ in measured:
            row.setdefault(INTERLEAVE_COLUMN, "repeats")
        return {index: found for (index, _, _), found in zip(live, measured)}

    def _guarded(self, runs: bool, start):
        """start() with a job's stop armed while it runs; None when the stop's signal interrupted it."""
        try:
            if self.stop is not None:
                self.stop.armed = runs
            return start()
        except KeyboardInterrupt:
            if self.stop is None or not self.stop.requested:
                raise  # Ctrl-C on a local run: finished cases are saved, this one has no row
            return None
        finally:
            if self.stop is not None:
                self.stop.armed = False

    def save(self, item, row: dict, samples: list, note: str = "") -> dict:
        """A measured row judged (explain, carried FLOPs), stamped with the machine and saved."""
        index, case, repeat = item
        if case.explain and repeat == 0:  # the first repeat's worker saved its profiled steps (launch.run_one):
            row.update(explain_row(row, self.store.dir))  # judged here, torch-free (analysis/explain/)
        if index in self.rerun_reasons:  # a disturbed pair's second run: it replaces the first's row
            row["rerun_reason"] = self.rerun_reasons[index]
            note = "run again at the end: its pair's first run was disturbed"
        if note:
            row["warnings"] = " | ".join(w for w in (row.get("warnings"), note) if isinstance(w, str) and w)
        self.flops.carry(case, row)
        _stamp(row, self.machine)
        self.store.add(row, samples, key=part_key(index, case, repeat))
        self.saved.add(index)
        self.rows[index] = row
        self.running.discard(index)
        if index in self.runnable:  # a gated case costs nothing: it is not in the budget's count
            self.planner.finished(row)
            if self.time_left is not None:
                self.time_left.finished(case, repeat, row)
        self.reporter.case_finished(case, row)
        if self.time_left is not None:
            self.reporter.time_left(self.time_left.seconds())
        return row


def retry_disturbed(run: _Run, pairs: list[list[tuple]]) -> None:
    """Run each disturbed pair (a group's repeat, every mode: studies/retry.py) once more, as it first ran
    (a lockstep set where it was one), while the machine is quiet (busy.quiet_now over 2 s) and the run's
    retry allowance holds it; the new rows replace the old and say why they were run again. What is not
    run again is said in a note and the manifest."""
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
            run.unit(unit, unit, position, "", 0)
            position += len(unit)


def _pair_cost(run: _Run, pair: list[tuple]) -> float | None:
    """What running a pair again should take: its cases' estimates (studies/time_left.py)."""
    costs = [run.time_left.estimate(case, repeat) for _, case, repeat in pair] if run.time_left else [None]
    return None if any(c is None for c in costs) else sum(costs)


def _first_words(row: dict) -> str:
    """Why a row was run again: its status and its contention evidence, in one short line."""
    evidence = str(row.get("contention") or row.get("reason") or "")
    return f"{row.get('status')}: {evidence}"[:200]


def _stamp(row: dict, machine: Machine) -> None:
    row["hostname"] = machine.hostname
    row.update(machine.fingerprint)
    row.update(machine.columns)


def _save_died(store: RunStore, rest, machine: Machine, stop, running: set = frozenset()) -> None:
    """Rows for the cases a stop cut short (their plan indexes in `running`: a lockstep set's members
    run together) and for those it never started."""
    status, reason = stop.status_and_reason()
    for item in rest:
        before = "while this case ran" if item[0] in running else "before this case started"
        _save_unrun(store, item, machine, status=status, reason=f"{reason} {before}")


def _save_unrun(store: RunStore, item, machine: Machine, **columns) -> dict:
    """A planned case's row without a worker's result (stopped, died, not run): its identity, the
    machine's columns and `columns`, saved under its plan key."""
    index, case, repeat = item
    row = base_row(case, repeat, machine.device, machine.versions, store.run_id)
    row.update(columns)
    _stamp(row, machine)
    store.add(row, [], key=part_key(index, case, repeat))
    return row


def run_suite(path, *, device: str | None = None, results_dir: str | Path = "results",
              reporter: Reporter | None = None, **overrides) -> pd.DataFrame:
    """Run a suite and return its results (one row per case and repeat).

    `overrides` replace suite settings after the device block: batch_sizes, precisions, steps,
    warmup_steps, repeats, timeout_s, seed, ... The DataFrame's attrs["run_dir"] names the run dir.
    """
    reporter = reporter or Reporter()
    session = Session.start(path, device, overrides)
    info = session.device
    try:
        order = schedule(session.suite.cases(info.type, overrides))
    except BaseException:
        session.close()
        raise
    workers = session.isolation_record()
    store = session.open_store(results_dir, overrides, kind="benchmark", cases_planned=len(order),
                               executor={"type": "local"}, workers=workers)
    store.write_plan(make_plan(order, info.type, device or session.suite.device))
    store.flush_every_s = TABLES_EVERY_S
    reporter.run_started(store, info, len(order))
    if spawn_note(workers):
        reporter.note(spawn_note(workers))
    machine = Machine(info, session.versions, session.host["hostname"], session.fingerprint, server=session.server)
    with session.running(lambda: finished_counts(store)), Heartbeat(store.dir, "parent") as heartbeat:
        run_cases(store, [(i, case, repeat) for i, (case, repeat) in enumerate(order)], machine, reporter,
                  heartbeat=heartbeat)
    return results_frame(store)


def finished_counts(store: RunStore) -> dict:
    saved = store.rows[: store.saved]
    counts = pd.Series([r["status"] for r in saved], dtype=object).value_counts().to_dict()
    return {"cases_finished": len(saved), "status_counts": counts}


def results_frame(store: RunStore) -> pd.DataFrame:
    """The run's rows as every later reader sees them: read back through the store's one reader (the
    in-memory records hold None where the table holds NaN, and a figure computed from one could
    differ from the same figure computed from the other)."""
    if store.saved != len(store.rows):
        store.flush()  # a killed run's last parts, not yet in the tables (RunStore.flush_every_s)
    frame = read_table([store.dir], "results", RESULT_COLUMNS) if store.rows else order_columns(pd.DataFrame())
    frame.attrs["run_dir"] = str(store.dir)
    return frame


def resume_local(run_dir, reporter: Reporter | None = None) -> pd.DataFrame:
    """`run --resume RUN_DIR` for a local run: run here the planned cases that have no row (the parent
    was killed, or Ctrl-C) or whose row says their job died, on the machine that measured the rest."""
    reporter = reporter or Reporter()
    store = RunStore.reopen(run_dir)
    state = run_state(store.dir, store.manifest)
    if state.state == "running":
        raise UserError(f"{store.dir}: still running ({state.detail}): let it finish, or stop it first")
    plan = store.read_plan()
    rows = rows_by_index(store)
    todo = [i for i, _, _ in plan_order(plan) if i not in rows or rows[i].get("status") in RERUN_STATUSES]
    order = plan_order(plan, todo)
    # the workers start as the run's first ones did (its manifest's `workers`): their peak RSS compares;
    # the server first, so the probe is one of its children rather than an interpreter of its own
    server = server_for((store.manifest.get("workers") or {}).get("mode", "spawn"),
                        [case.model.ref for _, case, _ in order], order[0][1].search_dirs) if order else None
    try:
        machine = _same_machine(store, plan, rows, server)
        reporter.run_started(store, machine.device, len(todo))
        if not todo:
            store.write_manifest(status="complete")
            return results_frame(store)
        store.update_manifest(lambda m: (m.update(status="running"), m.setdefault("resumed", []).append(
            {"at": utc_now().isoformat(), "cases": len(todo)})))
        with running(store, lambda: finished_counts(store)), Heartbeat(store.dir, "parent") as heartbeat:
            run_cases(store, order, machine, reporter, heartbeat=heartbeat)
    finally:
        if server is not None:
            server.close()
    return results_frame(store)


def _same_machine(store: RunStore, plan: dict, rows: dict, server) -> Machine:
    """This machine, probed, recorded, and checked to be the one (and the software) that measured the run."""
    probed = probe(plan["device_request"], server)
    info = DeviceInfo.from_json(probed["device"])
    host, fingerprint = record_machine(store, probed)
    measured = {str(r.get("fingerprint")) for r in rows.values() if r.get("fingerprint")}
    if info.type != plan["device_type"] or (measured and fingerprint["fingerprint"] not in measured):
        raise UserError(f"{store.dir}: was measured on another machine or software (fingerprint "
                        f"{', '.join(sorted(measured)) or plan['device_type']}; here {fingerprint['fingerprint']} "
                        f"on {info.name}): resume it where it ran, or run the suite again here")
    return Machine(info, probed["versions"], host["hostname"], fingerprint, server=server)
