"""Orchestration of a benchmark run: suite -> cases -> one worker per case and repeat -> results store.

What is measured lives in measure/; where and how one case runs, in launchers/ (launch.py, process.py);
the opening every study shares, in session.py; the order and its launches in run_plan.py, a disturbed pair's
second run in retry.py. This module runs cases from the plan
(run_cases: the local run, each SLURM job of studies/cluster.py, `run --resume` (resume.py) and
`run --try` alike), keeping the store up to date after every case.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from amp_bench.analysis.explain.judge import explain_row
from amp_bench.launchers.launch import BUSY_LOOK_S, base_row, run_shared, still_busy, stops_on_contention
from amp_bench.launchers.lockstep import INTERLEAVE_COLUMN, run_lockstep
from amp_bench.platform.device import DeviceInfo, may_run, precision_support
from amp_bench.store.columns import Row
from amp_bench.store.flags import is_true
from amp_bench.store.results import RESULT_COLUMNS, RunStore, order_columns, read_table
from amp_bench.store.run_state import Heartbeat
from amp_bench.studies.emulation import measured_support
from amp_bench.studies.flop_counts import FlopCounts
from amp_bench.studies.retry import pairs_to_retry, retry_disturbed
from amp_bench.studies.run_plan import BudgetPlanner, launch_units, make_plan, part_key, schedule
from amp_bench.studies.session import Machine, Session, spawn_note, workers_record
from amp_bench.studies.time_left import TimeLeft
from amp_bench.suite import Case


class Reporter:
    """Progress callbacks; the CLI renders them with rich, the API stays quiet."""

    def run_started(self, store: RunStore, device: DeviceInfo, total: int) -> None: ...
    def case_started(self, case: Case, repeat: int, index: int, total: int) -> None: ...
    def worker_event(self, case: Case, event: dict) -> None: ...
    def case_finished(self, case: Case, row: Row) -> None: ...
    def time_left(self, seconds: float | None) -> None: ...  # the run's estimate (studies/time_left.py)
    def note(self, text: str) -> None: ...


# After this many contended cases in a row, each next case first asks whether the machine is still busy
# (half a second of /proc/stat, BUSY_LOOK_S) and is saved as contended, not run, while it is: a worker
# started on a machine that stays busy only waits out the watch's hold (3 s) to be stopped, and a
# 40-repeat smoke suite beside three spinning processes would spend over 8 minutes saying so case by case.
BUSY_STREAK = 4
# run_suite rewrites results.csv and samples.csv at most this often (RunStore.flush_every_s): each
# rewrite builds the whole table, which on a 320-row smoke run had grown to ~0.1 s a case. Every row's
# part is on disk when its case ends; the tables catch up at the run's end and for any reader.
TABLES_EVERY_S = 2.0
RUN_LOOP = "the run loop"  # the writer of its rows' verdicts: why no worker measured a case, a rerun's reason


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
    if info.type == "cpu":  # an emulated mode's row says by how much, measured on one layer here
        supports = measured_support(supports, order, machine.server, store.dir / "logs")
    runnable = {index for index, case, _ in order if may_run(supports[index], case.allow_emulated)}
    budget_s = order[0][1].budget_s if order else None
    run = _Run(store, machine, reporter, supports, runnable, BudgetPlanner(budget_s, len(runnable)),
               TimeLeft([(c, r) for i, c, r in order if i in runnable], budget_s), len(order), stop, heartbeat)
    measured, streak, position = [], 0, 0
    for unit in units or launch_units(order, machine, reporter):  # `units`: a caller's own (run --try's pairs)
        if run.stopping():
            run.died(order[position:])
            return
        rows = run.unit(unit, position, streak)
        if rows is None:  # a stop cut it short: what it had not saved, and the rest, are saved as died
            run.died([item for item in order[position:] if item[0] not in run.rows], run.running)
            return
        for (index, case, repeat), row in zip(unit, rows, strict=True):
            if index in run.runnable:
                measured.append(((index, case, repeat), row))
                streak = streak + 1 if row["status"] == "contended" or is_true(row.get("contended")) else 0
        position += len(unit)
    if not run.stopping():
        retry_disturbed(run, pairs_to_retry(measured, stops_on_contention))


@dataclass
class _Run:
    """What every launch of a run shares: where rows go, the machine, the gate's decisions, the budget."""
    store: RunStore
    machine: Machine
    reporter: Reporter
    supports: dict  # plan index -> the hardware gate's decision, made once per planned case
    runnable: set  # the plan indexes the gate lets run
    planner: BudgetPlanner
    time_left: TimeLeft  # the estimate the progress display shows
    total: int
    stop: object = None
    heartbeat: object = None
    running: set = field(default_factory=set)  # plan indexes whose workers run now
    flops: FlopCounts = field(default_factory=FlopCounts)  # FLOPs counted once per model, batch and layout
    rows: dict = field(default_factory=dict)  # plan index -> its saved row
    rerun_reasons: dict = field(default_factory=dict)  # plan index -> why it runs again (retry_disturbed)

    def stopping(self) -> bool:
        return self.stop is not None and self.stop.requested

    def unit(self, unit: list, position: int, streak: int | None = None) -> list[Row] | None:
        """One unit's rows in plan order (None when a job's stop cut it short): its runnable items as one launch,
        or each item alone; not run while the machine stays busy after `streak` contended cases (None: not asked)."""
        live = [item for item in unit if item[0] in self.runnable]
        asks = streak is not None and streak >= BUSY_STREAK and live
        evidence = still_busy(live[0][1], self.machine.device) if asks else ""
        places = {index: position + n for n, (index, _, _) in enumerate(unit)}
        found = LaunchUnit(live, places).run(self) if len(live) > 1 and not evidence else {}
        if found is None:
            return None
        rows = []
        for item in unit:
            if evidence and item in live:
                rows.append(self.busy(item, evidence, streak))
                continue
            if item[0] not in found:
                alone = LaunchUnit([item], places, item[0] in self.runnable).run(self)
                if alone is None:
                    return None
                found.update(alone)
            rows.append(self.save(item, *found[item[0]]))
        return rows

    def guarded(self, runs: bool, start):
        """start() with a job's stop armed while it runs; None when the stop's signal interrupted it."""
        try:
            if self.stop is not None:
                self.stop.armed = runs
            return start()
        except KeyboardInterrupt:
            if not self.stopping():
                raise  # Ctrl-C on a local run: finished cases are saved, this one has no row
            return None
        finally:
            if self.stop is not None:
                self.stop.armed = False

    def died(self, rest, running: set = frozenset()) -> None:
        """Rows for the cases a job's stop cut short (plan indexes `running`) and for those it never started."""
        status, reason = self.stop.status_and_reason()
        for item in rest:
            before = "while this case ran" if item[0] in running else "before this case started"
            self.unrun(item, status=status, reason=f"{reason} {before}")

    def busy(self, item, evidence: str, streak: int) -> Row:
        """The row of a case not run because the machine was still busy after `streak` contended cases."""
        text = (f"not run: the machine was still busy ({evidence} over {BUSY_LOOK_S:g} s, after {streak} contended "
                "cases in a row)")
        row = self.unrun(item, status="contended", reason=text, contended=True, contention=text)
        self.reporter.case_finished(item[1], row)
        return row

    def unrun(self, item, **outcome) -> Row:
        """A planned case's row without a worker's result (stopped, died, not run): its plan, why, the machine's."""
        index, case, repeat = item
        row = base_row(case, repeat, self.machine.device, self.machine.versions, self.store.run_id)
        self.store.add(self.machine.stamp(row.put(RUN_LOOP, outcome)), [], key=part_key(index, case, repeat))
        return row

    def save(self, item, row: Row, samples: list) -> Row:
        """A launched row judged (its explain capture, the run's FLOPs), stamped with the machine and saved."""
        index, case, repeat = item
        flops = self.flops.carry(case, row)
        # the first repeat's worker saved its profiled steps (launch.run_one): judged here, torch-free
        judged = explain_row({**row, **row.held}, self.store.dir) if case.explain and repeat == 0 else {}
        row.put("the run's FLOPs", flops).put("the explain judge", judged)
        if index in self.rerun_reasons:  # a disturbed pair's second run: it replaces the first's row
            row.put(RUN_LOOP, {"rerun_reason": self.rerun_reasons[index]})
            row.warn("run again at the end: its pair's first run was disturbed")
        self.store.add(self.machine.stamp(row), samples, key=part_key(index, case, repeat))
        self.rows[index] = row
        self.running.discard(index)
        if index in self.runnable:  # a gated case costs nothing: it is not in the budget's count
            self.planner.finished(row)
            self.time_left.finished(case, repeat, row)
        self.reporter.case_finished(case, row)
        self.reporter.time_left(self.time_left.seconds())
        return row


@dataclass
class LaunchUnit:
    """One launch: an item alone, a repeat's modes as a lockstep set, or a case's consecutive repeats as windows of
    one worker. run() takes every launch's steps once: the budget's plan and the FLOPs ledger for its cases, the
    progress display and the heartbeat, the job's stop armed around it, and the stop's word on what came back."""
    items: list  # (plan index, case, repeat), in plan order
    places: dict  # plan index -> its place in the run, for the progress display
    runs: bool = True  # False: a gated item, whose row says why it does not run here

    def run(self, run: _Run) -> dict | None:
        """{plan index: (row, samples)}; None when a job's stop cut the launch short."""
        items = [(index, run.flops.assign(run.planner.plan(case)) if self.runs else case, repeat)
                 for index, case, repeat in self.items]
        windows = len(items) > 1 and len({case.case_id for _, case, _ in items}) == 1  # one worker's
        for index, case, repeat in items[:1] if windows else items:
            run.reporter.case_started(case, repeat, self.places[index], run.total)
        if run.heartbeat is not None:
            run.heartbeat.set(case=f"{items[0][1].case_id} r{items[0][2]}-{items[-1][2]}" if windows else
                              ", ".join(f"{case.case_id} r{repeat}" for _, case, repeat in items))
        run.running = {index for index, _, _ in items} if self.runs else set()
        found = run.guarded(self.runs, lambda: self._launch(items, windows, run))
        if found is None or (run.stopping() and self.runs and any(row["status"] != "ok" for row, _ in found)):
            return None  # the signal reached a worker first (SLURM signals the whole job): its end is the stop's
        for row, _ in found:  # one worker after another, unless the lockstep launcher said otherwise
            row.put(RUN_LOOP, {} if INTERLEAVE_COLUMN in row else {INTERLEAVE_COLUMN: "repeats" if self.runs else None})
        return {index: each for (index, _, _), each in zip(items, found, strict=True)}

    @staticmethod
    def _launch(items: list, windows: bool, run: _Run) -> list:
        """(row, samples) per item: a lockstep set's, or one worker's windows (an item alone: its one)."""
        machine, case = run.machine, items[0][1]
        where = {"device": machine.device, "versions": machine.versions, "store": run.store, "server": machine.server}
        if len(items) > 1 and not windows:
            return run_lockstep([(c, r, f"{c.case_id}-r{r}") for _, c, r in items],
                                supports=[run.supports[i] for i, _, _ in items], on_event=run.reporter.worker_event,
                                **where)
        return run_shared(case, [r for _, _, r in items], support=run.supports[items[0][0]],
                          on_event=lambda event: run.reporter.worker_event(case, event), **where)


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
    plan, workers = make_plan(order, info.type, device or session.suite.device), workers_record(session.server)
    store = session.open_store(results_dir, overrides, kind="benchmark", cases_planned=len(order),
                               executor={"type": "local"}, workers=workers)
    store.write_plan(plan)
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
