"""One case in one worker: write its spec, start the worker (plainly, or under torchrun for a DDP
case), and turn the outcome into a result row and its per-step samples. A worker that died without
a result is classified here (timeout, OOM kill, error), for every kind of study.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
from collections.abc import Callable
from pathlib import Path

from amp_bench.launchers import busy, torchrun
from amp_bench.launchers.busy import ContentionWatch, cores_needed
from amp_bench.launchers.forkserver import ForkServer, launch
from amp_bench.launchers.process import WorkerOutcome
from amp_bench.platform.device import DeviceInfo, Support, may_run, not_run_reason
from amp_bench.stats import phase_column
from amp_bench.store.columns import EXPLAIN_COLUMNS, Row
from amp_bench.store.results import RunStore, utc_now
from amp_bench.suite import Case

PLAN, WORKER, LAUNCHER = "the plan", "the worker", "the launcher"  # a row's writers, as a refused column names them


def stops_on_contention(case: Case) -> bool:
    """Does this case stop on contention (the suite's on_contention, or AMP_BENCH_ON_CONTENTION over it)?"""
    return (os.environ.get("AMP_BENCH_ON_CONTENTION") or case.on_contention) == "stop"


def _cores_needed(case: Case, device: DeviceInfo) -> int:
    threads = case.threads_per_rank or (int(os.environ["OMP_NUM_THREADS"])
                                        if os.environ.get("OMP_NUM_THREADS", "").isdigit() else None)
    return cores_needed(device.type, threads, case.nproc_per_node or 1)


def contention_watch(case: Case, device: DeviceInfo):
    """The watch that stops a starved case early (on_contention: stop; AMP_BENCH_ON_CONTENTION overrides
    the suite, as the test suite's shared cores need), as a factory of the worker's pid, or None."""
    if not stops_on_contention(case):
        return None
    needed = _cores_needed(case, device)
    return lambda pid: ContentionWatch(pid, needed)


# How long still_busy looks: /proc/stat counts in 10 ms ticks, so over half a second what others used is
# known to about 0.08 of a core on 2 CPUs, within a third of the 15% share a case may lose (the watch's
# own rule, launchers/busy.py). Beside three spinners the 40-pair smoke suite took 118 s, against 195 s
# with a one-second look at each of its ~160 cases.
BUSY_LOOK_S = 0.5


def still_busy(case: Case, device: DeviceInfo) -> str:
    """Asked after a streak of contended cases (studies/benchmark.BUSY_STREAK): is the machine still too
    busy to give this case its share, over BUSY_LOOK_S of /proc/stat (busy.quiet_now)? The evidence, or ''
    (quiet, or on_contention: flag, which measures anyway)."""
    if not stops_on_contention(case):
        return ""
    quiet, how = busy.quiet_now(_cores_needed(case, device), seconds=BUSY_LOOK_S)
    return "" if quiet else how


def run_job(store: RunStore, job: str, stem: str, spec: dict, timeout_s: float,
            on_event: Callable[[dict], None] | None = None, launcher: list[str] | None = None,
            extra_env: dict[str, str] | None = None, server: ForkServer | None = None,
            contention=None) -> WorkerOutcome:
    """Run one worker job (`case`, `fidelity`) with its spec; its log is logs/STEM.log. The spec and
    result files are removed afterwards (the result is in the outcome). With a fork server, the
    worker is its child where it can be (forkserver.launch)."""
    spec_path, result_path = store.work_path(stem, ".json"), store.work_path(stem, ".result.json")
    log_path = store.dir / "logs" / f"{stem}.log"
    spec_path.write_text(json.dumps(spec), encoding="utf-8")
    try:
        return launch([job, str(spec_path), str(result_path)], result_path, log_path, timeout_s,
                      on_event=on_event, launcher=launcher, extra_env=extra_env, server=server, contention=contention)
    finally:
        spec_path.unlink(missing_ok=True)


def run_one(case: Case, repeat: int, device: DeviceInfo, versions: dict, store: RunStore, support: Support,
            on_event: Callable[[dict], None] | None = None, stem: str | None = None,
            server: ForkServer | None = None) -> tuple[Row, list[dict]]:
    """One worker for one case: (result row, per-step samples); run_shared's one window."""
    return run_shared(case, [repeat], device, versions, store, support, on_event, server, stem)[0]


def run_shared(case: Case, repeats: list[int], device: DeviceInfo, versions: dict, store: RunStore, support: Support,
               on_event: Callable[[dict], None] | None = None, server: ForkServer | None = None,
               stem: str | None = None) -> list[tuple[Row, list[dict]]]:
    """Consecutive repeats of one case as windows of one worker (repeats_per_worker): it starts, builds and warms up
    once, then measures a window per repeat; (row, samples) per repeat. Each row is whole: a later repeat's has the
    worker's columns, its own window's, and its window alone as phases, so a worker's rows add up to its wall time.
    `support`: the gate's decision, made once by whoever planned the case; `stem` names its log file."""
    if not may_run(support, case.allow_emulated):  # each row: unsupported, why
        return [(base_row(case, r, device, versions, store.run_id).put(LAUNCHER, {
            "status": "unsupported", "reason": not_run_reason(support), "emulated": support.emulated}), [])
            for r in repeats]
    first, several = for_repeat(case, repeats[0]), len(repeats) > 1
    stem = stem or f"{case.case_id}-r{repeats[0]}" + (f"-{repeats[-1]}" if several else "")
    row = base_row(case, repeats[0], device, versions, store.run_id)
    launcher, extra_env, cache_dir = worker_setting(first, store, stem, row)
    spec = {**case_spec(first, device, support), "windows": len(repeats)}
    outcome = run_job(store, "case", stem, spec, case.timeout_s * len(repeats), on_event=on_event,
                      launcher=launcher, extra_env=extra_env, server=server, contention=contention_watch(case, device))
    later = (outcome.result or {}).pop("more_windows", [])
    windows = [dataclasses.replace(outcome, result=later[n] if n < len(later) else None, ended_at=None,
                                   wall_s=later[n].get(phase_column("window"), 0.0) if n < len(later) else 0.0)
               for n in range(len(repeats) - 1)]
    # the later windows' seconds are their rows': the first row's, the rest of the worker's
    alone = dataclasses.replace(outcome, wall_s=outcome.wall_s - sum(round(w.wall_s, 4) for w in windows))
    return [finish(row, alone, first, repeats[0], store, stem, cache_dir, window=0 if several else None)] + [
        finish(base_row(case, repeats[n], device, versions, store.run_id), each, for_repeat(case, repeats[n]),
               repeats[n], store, stem, None, window=n) for n, each in enumerate(windows, 1)]


def for_repeat(case: Case, repeat: int) -> Case:
    """FLOPs, per-phase memory and the explain profile do not change between repeats: the first repeat
    takes them."""
    return dataclasses.replace(case, instrument=False, explain=False) if repeat > 0 else case


def case_spec(case: Case, device: DeviceInfo, support: Support) -> dict:
    return {"case": case.to_json(), "device": device.to_json(), "support": dataclasses.asdict(support)}


def finish(row: Row, outcome: WorkerOutcome, case: Case, repeat: int, store: RunStore, stem: str,
           cache_dir, window: int | None = None) -> tuple[Row, list[dict]]:
    """The worker's outcome into its row, with how its process ran (`window`: which of its windows the row is):
    (row, per-step samples); its result file and a cold compile cache removed."""
    result_path = store.work_path(stem, ".result.json")
    record = dict(outcome.result or {})
    process = {"log_file": str(outcome.log_path.relative_to(store.dir)), "worker_start": outcome.started_by,
               "worker_wall_s": round(outcome.wall_s, 4),
               "peak_rss_lifetime_bytes": outcome.peak_rss_bytes,  # from wait4: the whole worker, all of it
               # peak RSS over the training steps: the worker's high-water mark read right after the
               # measured window, before the instrumented FLOP/phase steps (wait4 sees those too)
               "peak_rss_bytes": record.get("rss_hwm_bytes") or outcome.peak_rss_bytes}
    row.put(LAUNCHER, process if window is None else {**process, "worker_window": window})
    samples = _take_result(row, record, outcome, case, repeat, store) if outcome.result is not None else []
    if outcome.result is None:
        row.put(LAUNCHER, _ending(outcome, case, result_path))
    if cache_dir is not None and case.compile_cache == "cold":
        shutil.rmtree(cache_dir, ignore_errors=True)  # a cold cache serves one case: nothing reuses it
    result_path.unlink(missing_ok=True)
    for rank_file in result_path.parent.glob(f"{result_path.name}.rank*"):
        rank_file.unlink(missing_ok=True)
    shutil.rmtree(store.work_path(stem), ignore_errors=True)  # a DDP case's torchrun log folders
    return row, samples


def worker_setting(case: Case, store: RunStore, stem: str, row: Row) -> tuple:
    """(launcher, the case's own environment, compile cache folder): torchrun for a DDP case, the
    compile cache, where the explain trace goes."""
    launcher = extra_env = None
    if case.distributed:  # torchrun starts the worker on every rank (docs/distributed.md)
        launcher = torchrun.launch_command(case, f"{case.rdzv_id or case.suite}-{stem}", store.work_path(stem))
        extra_env = torchrun.launch_env(case)
    cache_dir = compile_cache_dir(store, case, stem)
    if cache_dir is not None:  # inductor's and triton's
        extra_env = {**(extra_env or {}), "TORCHINDUCTOR_CACHE_DIR": str(cache_dir),
                     "TRITON_CACHE_DIR": str(cache_dir / "triton")}
        row.put(LAUNCHER, {"compile_cache_dir": str(cache_dir.relative_to(store.dir))})
    if case.explain:  # where the worker saves the profiled step's trace (measure/telemetry/profile.py)
        extra_env = {**(extra_env or {}), "AMP_BENCH_EXPLAIN_TRACE": str(store.dir / "traces" / f"{stem}.json.gz")}
    return launcher, extra_env, cache_dir


def _take_result(row: Row, record: dict, outcome: WorkerOutcome, case: Case, repeat: int,
                 store: RunStore) -> list[dict]:
    """The worker's record into the row (its explain capture held for the run's judge), beside the exit phase and
    a contention only the parent saw (the window too short to judge itself); its per-step samples."""
    samples = [{"run_id": store.run_id, "case_id": case.case_id, "precision": case.precision,
                "repeat": repeat, **s} for s in record.pop("samples", [])]
    ended, seen = record.pop("worker_ended_at", None), {}  # its phases end here; the result's write and exit follow
    if ended is not None and outcome.ended_at is not None:
        seen[phase_column("exit")] = round(max(0.0, outcome.ended_at - ended), 4)
    if outcome.contention_seen and record.get("contended") is None:
        seen.update(contended=True, contention=outcome.contention_seen)
    row.held = {name: record.pop(name) for name in EXPLAIN_COLUMNS if name in record}
    if row.held.get("explain_trace"):
        row.held["explain_trace"] = str(Path(row.held["explain_trace"]).relative_to(store.dir))
    row.put(WORKER, {name: value for name, value in record.items() if name not in seen}).put(LAUNCHER, seen)
    return samples


def _ending(outcome: WorkerOutcome, case: Case, result_path: Path) -> dict:
    """Status and reason of a worker that left no result: stopped as contended, timed out, killed, failed."""
    if outcome.contention:  # stopped early by the parent (launchers/busy.py): the machine was not its to measure
        return {"status": "contended", "reason": outcome.contention, "contended": True,
                "contention": outcome.contention}
    status, reason = death(outcome, case.timeout_s)
    ending = {"status": status, "reason": reason}
    if case.distributed and outcome.timed_out:
        ending["reason"] = (f"no result within timeout_s={case.timeout_s:g} (a rank hung or waited for one); "
                            f"torchrun and its {case.world_size} ranks killed")
    if case.distributed and not outcome.timed_out:
        log = outcome.log_path.read_text(errors="replace") if outcome.log_path.exists() else ""
        explained = torchrun.explain_failure(result_path, log, case.world_size)
        if explained:
            ending["status"], ending["reason"] = explained
    return ending


def compile_cache_dir(store: RunStore, case: Case, stem: str) -> Path | None:
    """The inductor/triton cache a compiled case uses, inside the run directory so that no earlier run
    warms it: warm, one directory the run's cases share (later repeats and precisions find what the
    first compiled); cold, an empty directory of the case's own."""
    if not case.compiled:
        return None
    path = store.dir / "compile-cache" / ("shared" if case.compile_cache == "warm" else stem)
    path.mkdir(parents=True, exist_ok=True)
    return path


def death(outcome: WorkerOutcome, timeout_s: float) -> tuple[str, str]:
    """Status and reason of a worker that left no result: timed out, killed (the OOM killer's SIGKILL), failed."""
    if outcome.timed_out:
        return "timeout", f"no result within timeout_s={timeout_s:g}; worker killed"
    if outcome.exit_code == -signal.SIGKILL:
        return "oom", "worker was killed by SIGKILL without a result (usually the kernel's OOM killer)"
    log = outcome.log_path.read_text(errors="replace").splitlines() if outcome.log_path.exists() else []
    tail = next((line[:300] for line in reversed(log) if line.strip()), "")
    return "error", f"worker exited with code {outcome.exit_code} without a result" + (f": {tail}" if tail else "")


def base_row(case: Case, repeat: int, device: DeviceInfo, versions: dict, run_id: str) -> Row:
    """A row's identity and plan, what the parent knows before any worker: the case (its axes and settings, the
    DDP job and compile it asks for), the device it is planned for, torch's versions and the time."""
    ddp, compiled = case.distributed, case.compiled
    backend = case.dist_backend if case.dist_backend != "auto" else ("nccl" if device.type == "cuda" else "gloo")
    return Row(PLAN, {
        "run_id": run_id, "suite": case.suite, "case_id": case.case_id, "group_id": case.group_id,
        "model": case.model.ref, **case.axes, "precision": case.precision, "device": device.type,
        "device_name": device.name, "architecture": device.architecture, "repeat": repeat,
        "warmup_steps": case.warmup_steps, "optimizer": case.optimizer.name, "optimizer_impl": case.optimizer.impl,
        "seed": case.seed, "nnodes": case.nnodes, "dist_backend": backend if ddp else "",
        "scaling": "weak: per-process batch fixed" if ddp else "single process",  # measure/ddp.py's
        "global_batch_size": case.batch_size * case.world_size, "compile_note": case.compile_note,
        "compile_backend": case.compile_backend if compiled else "",
        "compile_cache": case.compile_cache if compiled else "",
        "compile_fullgraph": case.compile_fullgraph if compiled else None,
        "compile_optimizer": case.compile_optimizer if compiled else None,
        "torch_version": versions.get("torch_version", ""), "cuda_version": versions.get("torch_cuda_version", ""),
        "cudnn_version": versions.get("cudnn_version", ""), "timestamp": utc_now().isoformat(),
    })
