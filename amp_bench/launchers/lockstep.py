"""One repeat of a case group's modes as a lockstep set: their workers alive together, taking turns
(measure/conductor.py conducts them, measure/baton.py is a member's side). From here it looks like one
worker job (`lockstep`) whose members each leave the result file, log and row a case's worker would.

Used on the CPU only, for eager single-process cases whose workers fork from the run's fork server
(studies/run_plan.launch_units decides): two CUDA processes would share one device's memory and
NVML counters, and a DDP case is a torchrun job of its own.

Each member keeps its own ending: the conductor tells of every member it reaps as soon as it ends
(`member_end`), so a member that crashed, or that the conductor killed when its own turns outlasted its
case's timeout_s, is told apart from its partners; only members the conductor never reaped take the
set's ending (a contention stop, the set's deadline, the conductor's own failure, with its log named).
A conductor that may not fork refuses, and the members run one after another instead.
"""
from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

from amp_bench.launchers import launch, process
from amp_bench.launchers.forkserver import ForkServer
from amp_bench.platform.device import DeviceInfo, Support
from amp_bench.store.columns import Row
from amp_bench.store.results import RunStore
from amp_bench.suite import Case

INTERLEAVE_COLUMN = "interleave"  # steps: measured in a lockstep set; repeats: one worker after another
# The parent's deadline for the whole set, past its members' timeouts together: the conductor kills a
# member whose own turns outlast its case's timeout_s, so this one only fires when the conductor hangs.
SET_SLACK_S = 30.0


def run_lockstep(members: list[tuple[Case, int, str]], device: DeviceInfo, versions: dict, store: RunStore,
                 supports: list[Support], on_event: Callable[[Case, dict], None] | None = None,
                 server: ForkServer | None = None) -> list[tuple[Row, list[dict]]]:
    """Run (case, repeat, stem) members, every one of which may run here, as one lockstep set; returns
    each member's (row, per-step samples) in order."""
    prepared, specs = [], []
    for (case, repeat, stem), support in zip(members, supports, strict=True):
        row = launch.base_row(case, repeat, device, versions, store.run_id)
        case = launch.for_repeat(case, repeat)
        _, extra_env, cache_dir = launch.worker_setting(case, store, stem, row)
        spec_path = store.work_path(stem, ".json")
        spec_path.write_text(json.dumps(launch.case_spec(case, device, support)), encoding="utf-8")
        specs.append({"spec": str(spec_path), "result": str(store.work_path(stem, ".result.json")),
                      "log": str(store.dir / "logs" / f"{stem}.log"), "env": extra_env or {},
                      "timeout_s": case.timeout_s})
        Path(specs[-1]["result"]).unlink(missing_ok=True)
        prepared.append((row, case, repeat, stem, cache_dir))
    ended: dict[int, dict] = {}  # member place -> what the conductor reaped (member_end events)

    def each_member(event: dict) -> None:
        place = event.get("member")
        if not (isinstance(place, int) and 0 <= place < len(prepared)):
            return
        if event.get("event") == "member_end":
            ended[place] = event
        elif on_event is not None:
            on_event(prepared[place][1], event)

    first = prepared[0][1]
    stem = f"{first.group_id}-r{prepared[0][2]}-lockstep"
    started, started_at = time.monotonic(), time.time()
    deadline_s = sum(p[1].timeout_s for p in prepared) + SET_SLACK_S
    try:
        outcome = launch.run_job(store, "lockstep", stem, {"members": specs}, deadline_s, on_event=each_member,
                          server=server, contention=launch.contention_watch(first, device))
    finally:
        for spec in specs:
            Path(spec["spec"]).unlink(missing_ok=True)
    store.work_path(stem, ".result.json").unlink(missing_ok=True)
    conductor = outcome.result or {}
    if conductor.get("status") == "refused":
        return _one_after_another(members, device, versions, store, supports, on_event, server, conductor["reason"])
    ended.update(enumerate(conductor.get("members") or []))  # full records (peak RSS too) over the member_end events
    unreaped = _set_ending(outcome, stem, deadline_s, len(prepared))
    rows = []
    for n, (row, case, repeat, member_stem, cache_dir) in enumerate(prepared):
        found = _member_outcome(outcome, ended.get(n), specs[n], started, unreaped, started_at)
        row.put("the lockstep launcher", {INTERLEAVE_COLUMN: "steps"})
        rows.append(launch.finish(row, found, case, repeat, store, member_stem, cache_dir))
    return rows


def _one_after_another(members, device, versions, store, supports, on_event, server, why: str) -> list:
    """The set's members each in a worker of its own, one after another (the conductor refused)."""
    rows = []
    for (case, repeat, stem), support in zip(members, supports, strict=True):
        row, samples = launch.run_one(case, repeat, device, versions, store, support, stem=stem, server=server,
                               on_event=None if on_event is None else (lambda event, case=case: on_event(case, event)))
        row.put("the lockstep launcher", {INTERLEAVE_COLUMN: "repeats"}).warn(f"{why}; run alone")
        rows.append((row, samples))
    return rows


def _set_ending(conductor: process.WorkerOutcome, stem: str, deadline_s: float, size: int) -> dict | None:
    """The record a member the conductor never reaped takes: None when the set was stopped as contended
    (the member takes that stop), else the set's deadline or the conductor's failure, its log named."""
    if conductor.contention:
        return None
    log = f"logs/{stem}.log"
    if conductor.timed_out:
        return {"status": "timeout", "reason": f"the lockstep set ({size} members) had no end within its deadline "
                                               f"({deadline_s:g} s: their timeout_s together and {SET_SLACK_S:g}); "
                                               f"killed with its conductor ({log})"}
    failed = conductor.result or {}
    why = failed.get("reason") or launch.death(conductor, deadline_s)[1].replace("worker", "conductor", 1)
    return {"status": "error", "reason": f"the lockstep set's conductor failed: {why} ({log})"}


def _member_outcome(conductor: process.WorkerOutcome, reaped: dict | None, spec: dict, started: float,
                    unreaped: dict | None, started_at: float | None = None) -> process.WorkerOutcome:
    """A member's outcome as if it had been a worker of its own: its result file, its exit, peak RSS and
    deadline as its conductor reaped it; a member never reaped (it was still running) takes the set's
    ending (`unreaped`, or the contention stop)."""
    exit_code = reaped["exit_code"] if reaped else conductor.exit_code
    maxrss = reaped.get("maxrss_kib") if reaped else None  # not in a member_end event
    timed_out = bool(reaped.get("timed_out")) if reaped else False
    found = process.outcome(Path(spec["result"]), exit_code, timed_out, maxrss, started, Path(spec["log"]),
                            spec["timeout_s"], started_by=conductor.started_by)
    if reaped and reaped.get("ended_at") and started_at is not None:  # its own end, not the set's
        found.ended_at = reaped["ended_at"]
        found.wall_s = found.ended_at - started_at
    if found.result is None and timed_out:
        found.result = {"status": "timeout", "reason": f"no result within timeout_s={spec['timeout_s']:g} of its own "
                                                       "turns in a lockstep set; killed, its partners went on"}
    if found.result is None and reaped is None:
        if unreaped is None:
            found.contention = conductor.contention
        else:
            found.result = dict(unreaped)
    found.contention_seen = conductor.contention_seen
    return found
