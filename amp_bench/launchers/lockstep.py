"""One repeat of a case group's modes as a lockstep set: their workers alive together, taking turns
(measure/lockstep.py conducts them, measure/baton.py is a member's side). From here it looks like one
worker job (`lockstep`) whose members each leave the result file, log and row a case's worker would.

Used on the CPU only, for eager single-process cases whose workers fork from the run's fork server
(studies/benchmark.lockstep_sets decides): two CUDA processes would share one device's memory and
NVML counters, and a DDP case is a torchrun job of its own.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable

from amp_bench.launchers import process
from amp_bench.launchers.forkserver import ForkServer
from amp_bench.launchers.launch import (base_row, case_spec, contention_watch, finish, for_repeat, run_job,
                                        worker_setting)
from amp_bench.platform.device import DeviceInfo, Support
from amp_bench.store.results import RunStore
from amp_bench.suite import Case

INTERLEAVE_COLUMN = "interleave"  # steps: measured in a lockstep set; repeats: one worker after another


def run_lockstep(members: list[tuple[Case, int, str]], device: DeviceInfo, versions: dict, store: RunStore,
                 supports: list[Support], on_event: Callable[[Case, dict], None] | None = None,
                 server: ForkServer | None = None) -> list[tuple[dict, list[dict]]]:
    """Run (case, repeat, stem) members, every one of which may run here, as one lockstep set; returns
    each member's (row, per-step samples) in order."""
    prepared, specs = [], []
    for (case, repeat, stem), support in zip(members, supports):
        row = base_row(case, repeat, device, versions, store.run_id)
        case = for_repeat(case, repeat)
        _, extra_env, cache_dir = worker_setting(case, store, stem, row)
        spec_path, result_path = store.dir / "work" / f"{stem}.json", store.dir / "work" / f"{stem}.result.json"
        spec_path.write_text(json.dumps(case_spec(case, device, support)), encoding="utf-8")
        result_path.unlink(missing_ok=True)
        specs.append({"spec": str(spec_path), "result": str(result_path),
                      "log": str(store.dir / "logs" / f"{stem}.log"), "env": extra_env or {}})
        prepared.append((row, case, repeat, stem, cache_dir))

    def each_member(event: dict) -> None:
        place = event.get("member")
        if on_event is not None and isinstance(place, int) and 0 <= place < len(prepared):
            on_event(prepared[place][1], event)

    first = prepared[0][1]
    stem = f"{first.group_id}-r{prepared[0][2]}-lockstep"
    started = time.monotonic()
    try:
        outcome = run_job(store, "lockstep", stem, {"members": specs}, sum(p[1].timeout_s for p in prepared),
                          on_event=each_member, server=server, contention=contention_watch(first, device))
    finally:
        for spec in specs:
            Path(spec["spec"]).unlink(missing_ok=True)
    reaped = (outcome.result or {}).get("members") or []
    (store.dir / "work" / f"{stem}.result.json").unlink(missing_ok=True)
    rows = []
    for n, (row, case, repeat, member_stem, cache_dir) in enumerate(prepared):
        found = _member_outcome(outcome, reaped[n] if n < len(reaped) else None, specs[n], started, case.timeout_s)
        row[INTERLEAVE_COLUMN] = "steps"
        rows.append(finish(row, found, case, repeat, store, member_stem, cache_dir))
    return rows


def _member_outcome(conductor: process.WorkerOutcome, reaped: dict | None, spec: dict, started: float,
                    timeout_s: float) -> process.WorkerOutcome:
    """A member's outcome as if it had been a worker of its own: its result file, its exit and peak RSS
    (as its conductor reaped it), else the conductor's ending (a deadline, a contention stop, a death)."""
    exit_code = reaped["exit_code"] if reaped else conductor.exit_code
    maxrss = reaped["maxrss_kib"] if reaped else None
    found = process.outcome(Path(spec["result"]), exit_code, conductor.timed_out, maxrss, started,
                            Path(spec["log"]), timeout_s, started_by=conductor.started_by)
    if found.result is None:
        found.contention = conductor.contention
    found.contention_seen = conductor.contention_seen
    return found
