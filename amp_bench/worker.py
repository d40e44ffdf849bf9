"""The worker process: runs exactly one case (or the device probe) and writes one JSON record.

    python -m amp_bench.worker case     SPEC.json RESULT.json
    python -m amp_bench.worker fidelity SPEC.json RESULT.json
    python -m amp_bench.worker lockstep SPEC.json RESULT.json   (the members' specs: measure/conductor.py)
    python -m amp_bench.worker inventory SPEC.json RESULT.json  (GPU cases' steps on fake tensors: predict)
    python -m amp_bench.worker emulation SPEC.json RESULT.json  (an emulated mode's slowdown, on one layer)
    python -m amp_bench.worker probe DEVICE    RESULT.json

Progress events go to the file descriptor named by AMP_BENCH_EVENT_FD as JSON lines, so whatever
the model prints to stdout/stderr goes to the case's log untouched. The result file is written
atomically; a worker that dies without one is classified by the parent. What a case measures is in
measure/case.py; what every worker shares (events, atomic writes, OOM, parent death) in
measure/channel.py, measure/ending.py.
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback

from amp_bench.measure.channel import EventChannel, write_json_atomic
from amp_bench.measure.ending import die_with_parent, exit_without_teardown, is_oom
from amp_bench.measure.phases import PhaseClock


def _case_job(spec: dict, events: EventChannel, rank, phases) -> dict:
    from amp_bench.measure import ddp
    from amp_bench.measure.baton import NO_BATON, Baton
    from amp_bench.measure.case import run_case
    from amp_bench.platform.device import DeviceInfo, Support
    from amp_bench.suite import Case
    case, device = Case.from_json(spec["case"]), DeviceInfo.from_json(spec["device"])
    support = Support(**spec["support"])  # the parent's gate decision: the worker does not decide again
    baton = Baton.from_env()  # a lockstep member's (measure/conductor.py)
    if baton is not None:  # its waits for the other members' turns are a phase of their own
        phases.waited = lambda: baton.waited_s
    record = run_case(case, device, events, rank, support=support, baton=baton or NO_BATON, phases=phases,
                      windows=int(spec.get("windows", 1)))
    if rank is not None:  # every rank gets every record; each node's local rank 0 writes the row
        more = record.pop("more_windows", [])
        record = ddp.aggregate(rank.gather(record), case)
        if more:  # a later window's: every rank's gathered too
            record["more_windows"] = [ddp.aggregate(rank.gather(window), case) for window in more]
    if baton is not None:  # what this case cost: its own turns, not its partners'
        record["worker_seconds"] = baton.holding_s()
    return record


def _lockstep_job(spec: dict, events: EventChannel, rank, phases) -> dict:  # one process, never under torchrun
    from amp_bench.measure.conductor import conduct
    from amp_bench.platform.forking import unsafe_to_fork
    # CUDA only: the thread count a fork server's child sets (torch.set_num_threads) starts torch's
    # pthreadpool, which torch itself re-creates in a forked child (pthread_atfork); OpenMP's pool starts
    # at the first parallel op, and the conductor runs none
    unsafe = unsafe_to_fork("the lockstep conductor", count_threads=False)
    if unsafe:  # the parent runs the members one after another instead (launchers/lockstep.py)
        return {"status": "refused", "reason": f"lockstep set not conducted: {unsafe}"}
    return conduct(spec, events, lambda spec_path, result_path, member_events: _main_job(
        _case_job, spec_path, result_path, member_events))


def _fidelity_job(spec: dict, events: EventChannel, rank, phases) -> dict:  # one process, never under torchrun
    from amp_bench.platform.device import DeviceInfo, Support
    from amp_bench.studies.fidelity.train import train_precision
    from amp_bench.suite import FidelitySpec
    support = Support(**spec["support"])  # the parent's gate decision
    return train_precision(FidelitySpec.from_json(spec["spec"]), spec["precision"],
                           DeviceInfo.from_json(spec["device"]), events, support)


def _inventory_job(spec: dict, events: EventChannel, rank, phases) -> dict:  # one process, never under torchrun
    """Record each item's training step on fake tensors (measure/fake_step.py) where the spec says; a case
    that cannot be recorded is named with its reason, the others are recorded."""
    from amp_bench.measure.fake_step import record_case, save
    from amp_bench.suite import Case
    failed = {}
    for item in spec["items"]:
        try:
            trace, memory, details = record_case(Case.from_json(item["case"]))
        except Exception as exc:  # one model that fakes badly must not lose the others
            failed[item["key"]] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc) else ''}"
            continue
        save(trace, {**memory, "details": details}, item["trace"], item["memory"])
    return {"status": "ok", "failed": failed}


def _emulation_job(spec: dict, events: EventChannel, rank, phases) -> dict:  # one process, never under torchrun
    """Per group (a model at a batch and layout), its largest layer timed in fp32 and in each mode the CPU
    only emulates (measure/emulation_probe.py); a group that cannot be probed says why."""
    from amp_bench.measure.emulation_probe import largest_layer, slowdowns
    from amp_bench.suite import Case
    measured = {}
    for group in spec["groups"]:
        try:
            case = Case.from_json(group["case"])
            found = largest_layer(case)
            measured[group["key"]] = {"error": "no convolution or linear layer to time"} if found is None else \
                slowdowns(found, group["precisions"], group["budget_s"], case.channels_last)
        except Exception as exc:  # a model the probe cannot take keeps the gate's own reason
            measured[group["key"]] = {"error": f"{type(exc).__name__}: {str(exc).strip()[:200]}"}
    return {"status": "ok", "measured": measured}


JOBS = {"case": _case_job, "fidelity": _fidelity_job, "lockstep": _lockstep_job, "inventory": _inventory_job,
        "emulation": _emulation_job}


def _main_job(job, spec_path: str, result_path: str, events: EventChannel) -> int:
    phases = PhaseClock.from_env()
    phases.mark("start")
    from amp_bench.measure import ddp
    from amp_bench.measure.compiling import compile_reason, is_compile_error
    from amp_bench.measure.step import UnsupportedCase  # imports torch: the `imports` phase, up to run_case's

    with open(spec_path, encoding="utf-8") as fh:
        spec = json.load(fh)
    started = time.time()
    rank = ddp.Rank.from_env()
    try:
        record = job(spec, events, rank, phases)
    except UnsupportedCase as exc:  # decided alike on every rank, before any collective
        record = {"status": "unsupported", "reason": str(exc)}
    except BaseException as exc:  # every failure becomes a status, never a crash
        traceback.print_exc()
        kind = "oom" if is_oom(exc) else "error"
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        record = {"status": kind, "reason": f"{type(exc).__name__}: {message}"[:500]}
        if kind == "error" and is_compile_error(exc):  # torch.compile failed, not the model: its own status
            record = {"status": "compile_error", "reason": compile_reason(exc)}
        if rank is not None:
            # this rank's own account, then a non-zero exit: torchrun stops the other ranks (which
            # would wait for this one in the next collective) and the parent reads the account
            record.update(rank=rank.rank, failed_at=time.time())
            write_json_atomic(ddp.rank_result_path(result_path, rank.rank), record)
            exit_without_teardown(1)  # no interpreter teardown: it could wait on a collective that never ends
    record.setdefault("worker_seconds", time.time() - started)
    if job is _case_job:  # where its wall time went, up to this result (the parent adds its exit)
        phases.mark("result")
        record.update(phases.columns())
    if rank is None or rank.local_rank == 0:
        write_json_atomic(result_path, record)
    if rank is not None:
        ddp.Rank.teardown()
    return 0


def _main_probe(requested: str, result_path: str) -> int:
    from amp_bench.platform.device import DeviceUnavailable, describe_support, probe_device
    from amp_bench.platform.provenance import gpu_facts, versions
    try:
        device = probe_device(requested)
    except DeviceUnavailable as exc:
        write_json_atomic(result_path, {"error": str(exc)})
        return 0
    write_json_atomic(result_path, {
        "device": device.to_json(),
        "architecture": device.architecture,
        "support": {mode: s.__dict__ for mode, s in describe_support(device)},
        "versions": versions(),
        "gpu": gpu_facts(device),  # the software record (pip freeze, git) is the parent's, beside the first case
    })
    return 0


def main(argv: list[str]) -> int:
    die_with_parent()
    fd = os.environ.get("AMP_BENCH_EVENT_FD")
    path = os.environ.get("AMP_BENCH_EVENT_PATH")  # under torchrun: the launcher's pipe, for rank 0
    if fd is None and path and os.environ.get("RANK", "0") == "0":
        try:
            fd = str(os.open(path, os.O_WRONLY))
        except OSError:
            fd = None  # no progress events; the measurement goes on
    events = EventChannel(int(fd) if fd else None)
    if len(argv) == 3 and argv[0] in JOBS:
        return _main_job(JOBS[argv[0]], argv[1], argv[2], events)
    if len(argv) == 3 and argv[0] == "probe":
        return _main_probe(argv[1], argv[2])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    exit_without_teardown(main(sys.argv[1:]))  # the result is written: no second of interpreter teardown
