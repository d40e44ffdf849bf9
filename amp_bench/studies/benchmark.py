"""Orchestration of a benchmark run: suite -> cases -> one worker per case and repeat -> results store.

What is measured lives in measure/; where and how one case runs, in launchers/ (launch.py, process.py);
the opening every study shares, in session.py; the order and its launches in run_plan.py, the rows no worker
measured in unrun.py, a disturbed pair's second run in retry.py. This module runs cases from the plan
(run_cases: the local run, each SLURM job of studies/cluster.py, `run --resume` (resume.py) and
`run --try` alike), keeping the store up to date after every case.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from amp_bench.analysis.explain.judge import explain_row
from amp_bench.launchers.launch import run_one, run_shared, still_busy, stops_on_contention
from amp_bench.launchers.lockstep import INTERLEAVE_COLUMN, run_lockstep
from amp_bench.platform.device import DeviceInfo, may_run, precision_support
from amp_bench.store.flags import is_true
from amp_bench.store.results import RESULT_COLUMNS, RunStore, order_columns, read_table
from amp_bench.store.run_state import Heartbeat
from amp_bench.studies.emulation import measured_support
from amp_bench.studies.flop_counts import FlopCounts
from amp_bench.studies.retry import pairs_to_retry, retry_disturbed
from amp_bench.studies.run_plan import BudgetPlanner, launch_units, make_plan, part_key, schedule
from amp_bench.studies.session import Machine, Session, spawn_note, workers_record
from amp_bench.studies.time_left import TimeLeft
from amp_bench.studies.unrun import save_busy, save_died, stamp
from amp_bench.suite import Case


class Reporter:
    """Progress callbacks; the CLI renders them with rich, the API stays quiet."""

    def run_started(self, store: RunStore, device: DeviceInfo, total: int) -> None: ...
    def case_started(self, case: Case, repeat: int, index: int, total: int) -> None: ...
    def worker_event(self, case: Case, event: dict) -> None: ...
    def case_finished(self, case: Case, row: dict) -> None: ...
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
    run = _Run(store, machine, reporter, supports, runnable, BudgetPlanner(budget_s, len(runnable)), stop, heartbeat,
               len(order), time_left=TimeLeft([(c, r) for i, c, r in order if i in runnable], budget_s))
    measured, streak, position = [], 0, 0
    for unit in units or launch_units(order, machine, reporter):  # `units`: a caller's own (run --try's pairs)
        if stop is not None and stop.requested:
            save_died(store, order[position:], machine, stop)
            return
        live = [item for item in unit if item[0] in runnable]
        evidence = still_busy(live[0][1], info) if streak >= BUSY_STREAK and live else ""
        rows = run.unit(unit, live, position, evidence, streak)
        if rows is None:  # a stop cut it short: what it had not saved, and the rest, are saved as died
            save_died(store, [item for item in order[position:] if item[0] not in run.saved], machine, stop,
                       running=run.running)
            return
        for (index, case, repeat), row in zip(unit, rows, strict=True):
            if index in runnable:
                measured.append(((index, case, repeat), row))
                streak = streak + 1 if row["status"] == "contended" or is_true(row.get("contended")) else 0
        position += len(unit)
    if not (stop is not None and stop.requested):
        retry_disturbed(run, pairs_to_retry(measured, stops_on_contention))


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
            return [save_busy(self.store, item, self.machine, self.reporter, evidence, streak)
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
        if measured is None or (self.stop is not None and self.stop.requested and
                                any(row["status"] != "ok" for row, _ in measured)):
            return None
        return {index: found for (index, _, _), found in zip(planned, measured, strict=True)}

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
        return {index: found for (index, _, _), found in zip(live, measured, strict=True)}

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
        stamp(row, self.machine)
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
    workers = workers_record(session.server)
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
