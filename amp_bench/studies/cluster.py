"""A suite on a SLURM cluster's partitions: one run directory per partition in one results root, its
cases shared out among SLURM jobs (an array of `tasks` jobs), each job running its share on its
node as a local run does (a fresh worker per case, rows written by the job itself, atomically:
studies/benchmark.run_cases): its own fork server (unless the suite asks for isolation: spawn), so each
worker is a fork rather than an interpreter paying its imports, and on the CPU its repeats' modes run as
lockstep sets. The parent is optional: it watches and can cancel, but a detached run finishes without it,
and `run --resume` picks up what is missing.

A model-and-batch group (its precisions and repeats) always stays in one job, so every speedup is
measured on one GPU, interleaved as locally. A job that SLURM ends leaves rows that say so: the job
writes them itself at the signal (cancelled, time_limit, preempted); for a job that never ran or
whose node died, the parent (or --resume) writes them from SLURM's state (node_fail, lost, ...).
"""
from __future__ import annotations

import dataclasses
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

from amp_bench.errors import UserError
from amp_bench.executors import job_states, slurm
from amp_bench.executors.job_env import StopSignals, this_job
from amp_bench.launchers.launch import base_row
from amp_bench.platform.device import DeviceInfo
from amp_bench.store.results import RunStore, make_run_id, utc_now
from amp_bench.store.run_state import DIED_STATUSES, RERUN_STATUSES, Heartbeat, live_beats, read_heartbeats, run_state
from amp_bench.studies import benchmark
from amp_bench.studies import run_plan as planning
from amp_bench.studies.session import Machine, new_store, probe, record_machine, server_for, workers_record
from amp_bench.suite import Case, ExecutorSpec, load_suite, validate_overrides

PROBE_MARGIN_S = 600  # a job's time limit: its cases' timeouts, plus this for start-up and the probe
MAX_TIME_MIN = 24 * 60
CANCEL_GRACE_S = 45.0  # after scancel: time for the jobs to write their rows (SLURM's KillWait is 30 s)


@dataclass
class ClusterRun:
    partition: str
    store: RunStore
    job_ids: list[str]
    planned: int

    def counts(self) -> dict[str, int]:
        """Rows so far: ok, not run (unsupported here), failed (any other status), of planned."""
        self.store.refresh()
        statuses = [r.get("status") for r in self.store.rows]
        ok, unsupported = statuses.count("ok"), statuses.count("unsupported")
        return {"ok": ok, "unsupported": unsupported, "failed": len(statuses) - ok - unsupported,
                "planned": self.planned}


class ClusterReporter:
    """Progress of a cluster run; the CLI draws it with rich (cli/console.py), the API stays quiet."""

    def submitted(self, run: ClusterRun, spec: ExecutorSpec, device_type: str, time_min: int, gpus: int) -> None: ...
    def progress(self, runs: list[ClusterRun], states: dict[str, job_states.JobState]) -> None: ...
    def cancelling(self, job_ids: list[str]) -> None: ...
    def close(self) -> None: ...


# ----------------------------------------------------------------------------- planning and submitting

def plan_device(requested: str, partition: slurm.Partition, spec: ExecutorSpec) -> str:
    """The device type a partition's cases are planned for: as asked, or for `auto`, cuda where its
    nodes have GPUs (sinfo's GRES, or GPUs asked for) and the CPU elsewhere."""
    if requested != "auto":
        return "cpu" if requested == "cpu" else "cuda"
    asked = bool(spec.gpus_per_node) or "gpu" in (spec.gres or "")
    return "cuda" if partition.has_gpus or asked else "cpu"


def share_out(order: list[tuple[Case, int]], tasks: int) -> list[list[int]]:
    """Plan indices per job: whole groups (a model and batch, every precision and repeat), dealt out
    in turn, so a group's speedups come from one node."""
    groups: dict[str, list[int]] = {}
    for index, (case, _) in enumerate(order):
        groups.setdefault(case.group_id, []).append(index)
    shares: list[list[int]] = [[] for _ in range(max(1, min(tasks, len(groups))))]
    for n, indices in enumerate(groups.values()):
        shares[n % len(shares)].extend(indices)
    return [sorted(s) for s in shares if s]


def time_limit_min(cases: list[Case], spec: ExecutorSpec) -> int:
    return spec.time_min or min(MAX_TIME_MIN, math.ceil((sum(c.timeout_s for c in cases) + PROBE_MARGIN_S) / 60))


def gpus_for(cases: list[Case], device_type: str, spec: ExecutorSpec) -> int:
    if spec.gpus_per_node is not None:
        return spec.gpus_per_node
    return max([c.nproc_per_node or 1 for c in cases] + [1]) if device_type == "cuda" else 0


def submit_share(store: RunStore, spec: ExecutorSpec, partition: slurm.Partition, shares: list[list[int]],
                 cases: dict[int, Case], device_type: str, name: str) -> tuple[list[str], int, int]:
    """Submit one job per share; record them in the manifest: (job ids, time limit, GPUs per job)."""
    share_cases = [[cases[i] for i in share] for share in shares]
    time_min = max(time_limit_min(c, spec) for c in share_cases)
    gpus = max(gpus_for(c, device_type, spec) for c in share_cases)
    job_ids = slurm.submit(spec, partition, store.dir / "slurm", job_main,
                           [(str(store.dir), share) for share in shares], time_min, gpus, name)
    at = utc_now().isoformat()

    def add(manifest: dict) -> None:
        jobs = manifest.setdefault("jobs", {})
        for job_id, share in zip(job_ids, shares, strict=True):
            jobs[job_id] = {"indices": share, "partition": partition.name, "submitted_at": at,
                            "time_min": time_min, "gpus": gpus}
        manifest["status"] = "running"
    store.update_manifest(add)
    return job_ids, time_min, gpus


def run_on_cluster(path, spec: ExecutorSpec, *, device: str | None = None, results_dir: str | Path = "results",
                   reporter: ClusterReporter | None = None, detach: bool = False, **overrides) -> list[ClusterRun]:
    """Submit the suite to every partition of `spec`; unless detached, watch until every job ended."""
    reporter = reporter or ClusterReporter()
    suite = load_suite(path)
    if overrides:
        validate_overrides(overrides, suite.path)
    partitions = slurm.partitions(list(spec.partitions), spec.cluster)
    requested = device or suite.device
    planned = []
    for partition in partitions.values():  # every plan is checked before anything is submitted
        device_type = plan_device(requested, partition, spec)
        planned.append((partition, device_type, planning.schedule(suite.cases(device_type, overrides))))
    runs = []
    for partition, device_type, order in planned:
        store = new_store(suite, path, results_dir, make_run_id(device_type, host=partition.name), overrides,
                          "benchmark", cases_planned=len(order),
                          executor={**spec.to_json(), "partition": partition.name},
                          isolation={**suite.settings, **overrides}.get("isolation", "fork"))
        store.write_plan(planning.make_plan(order, device_type, requested))
        store.flush()  # an empty results.csv: the directory is a run like any other from the start
        shares = share_out(order, spec.tasks)
        job_ids, time_min, gpus = submit_share(store, spec, partition, shares, dict(enumerate(c for c, _ in order)),
                                               device_type, f"amp_bench-{suite.name}-{partition.name}")
        run = ClusterRun(partition.name, store, job_ids, len(order))
        reporter.submitted(run, spec, device_type, time_min, gpus)
        runs.append(run)
    if not detach:
        watch(runs, spec.cluster, spec.poll_s, reporter)
    return runs


# ----------------------------------------------------------------------------- on the node

def job_main(run_dir: str, indices: list[int]) -> dict:
    """What one SLURM job runs: its share of the plan (those cases without a row, or whose row says
    its job died), each in a fresh worker, rows saved as they finish. A signal from SLURM stops it
    with rows that say why."""
    store = RunStore.reopen(run_dir)
    job = this_job()
    if job is not None and not job.partition:  # submitit's local executor: the run's own partition name
        job = dataclasses.replace(job, partition=(store.manifest.get("executor") or {}).get("partition", ""))
    plan = store.read_plan()
    done = planning.rows_by_index(store)
    order = [o for o in planning.plan_order(plan, indices)
             if o[0] not in done or done[o[0]].get("status") in RERUN_STATUSES]
    job_id = job.job_id if job else str(os.getpid())
    fields = {**(job.to_json() if job else {}), "job_id": job_id, "indices": list(indices)}
    # the job's own fork server, as a local run has (a run written before `isolation` was recorded spawned)
    server = server_for(store.manifest.get("isolation", "spawn"), [case.model.ref for _, case, _ in order],
                        order[0][1].search_dirs) if order else None
    with StopSignals(job) as stop, Heartbeat(store.dir, f"job-{job_id}", **fields) as heartbeat:
        try:
            machine = _job_machine(store, plan, job, job_id, order, server)
            if machine is not None:
                benchmark.run_cases(store, order, machine, benchmark.Reporter(), stop=stop, heartbeat=heartbeat)
        finally:
            if server is not None:
                server.close()
        if stop.requested:
            heartbeat.fields["outcome"] = f"stopped: {stop.status_and_reason()[1]}"
    store.update_manifest(lambda m: m.setdefault("jobs", {}).setdefault(job_id, {}).update(
        ended_at=utc_now().isoformat()))
    finalize(store)
    return {"run_dir": run_dir, "cases": len(order)}


def _job_machine(store: RunStore, plan: dict, job, job_id: str, order, server=None) -> Machine | None:
    """Probe the node's device and record it, and how the job's workers start (manifest and rows); None
    when the cases cannot run here: each then gets an error row saying why."""
    columns = job.columns() if job else {}
    try:
        probed = probe(plan.get("device_request", "auto"), server)
    except UserError as exc:
        _error_rows(store, order, columns, f"on {columns.get('slurm_node') or 'the node'}: {exc.lines[0]}")
        return None
    info = DeviceInfo.from_json(probed["device"])
    gpu = probed.get("gpu", {})
    seen = {"node": columns.get("slurm_node", ""), "device_name": info.name, "architecture": info.architecture,
            "compute_capability": ".".join(map(str, info.capability)) if info.capability else "",
            "gpu_uuid": gpu.get("gpu_uuid", ""), "driver_version": gpu.get("driver_version", ""),
            "started_at": utc_now().isoformat(), "workers": workers_record(server), **columns}
    host, fingerprint = record_machine(store, probed)
    store.update_manifest(lambda m: m.setdefault("jobs", {}).setdefault(job_id, {}).update(seen))
    if info.type != plan["device_type"]:
        _error_rows(store, order, columns, f"planned for {plan['device_type']}, but the job on "
                    f"{columns.get('slurm_node') or host['hostname']} found {info.type} ({info.name}): ask for GPUs "
                    "(--slurm-gpus-per-node, --slurm-gres) or plan for the CPU (--device cpu)")
        return None
    return Machine(info, probed["versions"], host["hostname"], fingerprint, columns, server=server)


def _error_rows(store: RunStore, order, columns: dict, reason: str) -> None:
    device = DeviceInfo("unknown", "unknown")
    for index, case, repeat in order:
        row = base_row(case, repeat, device, {}, store.run_id)
        store.add(row.put("the job", {"status": "error", "reason": reason, **columns}), [],
                  key=planning.part_key(index, case, repeat))


def finalize(store: RunStore, states: dict | None = None) -> str:
    """Mark the run complete (every case has a row, none died) or interrupted (its jobs all ended with
    cases left), under the run's lock; leave it running while a job may still write. The state."""
    store.refresh()
    manifest = store.manifest
    state = run_state(store.dir, manifest)
    jobs = manifest.get("jobs") or {}
    still = [j for j, s in (states or {}).items() if s.active and j in jobs]
    if state.live or still or (states is None and state.waiting_jobs):
        return "running"
    rows = planning.rows_by_index(store)
    missing = [i for i in range(manifest.get("cases_planned") or 0) if i not in rows]
    died = [i for i, r in rows.items() if r.get("status") in DIED_STATUSES]
    status = "complete" if not missing and not died else "interrupted"
    fields = {"status": status, "finished_at": utc_now().isoformat()}
    if status == "interrupted":
        fields["interrupted_reason"] = (f"{len(missing) + len(died)} case(s) did not finish (their jobs ended first): "
                                        f"`python -m amp_bench run --resume {store.dir}` runs them")
    store.update_manifest(lambda m: m.update(fields) if m.get("status") != "complete" else None)
    return status


# ----------------------------------------------------------------------------- watching, cancelling, resuming

def reconcile(store: RunStore, states: dict[str, job_states.JobState], cancelled: bool = False) -> int:
    """Rows for the cases of ended jobs that wrote none (a job cancelled while queued, a node that
    died): the status from SLURM's state, the reason its words (`cancelled`: the parent cancelled
    them). The count written."""
    store.refresh()
    plan = store.read_plan()
    rows = planning.rows_by_index(store)
    cases = {i: (case, repeat) for i, case, repeat in planning.plan_order(plan)}
    written = 0
    started = {str(b.get("job_id")) for b in read_heartbeats(store.dir)}
    for job_id, job in (store.manifest.get("jobs") or {}).items():
        state = states.get(job_id)
        if state is None or state.active:
            continue
        for index in job.get("indices", []):
            if index in rows or index not in cases:
                continue
            case, repeat = cases[index]
            when = "before this case finished" if job_id in started else "before it started"
            row = base_row(case, repeat, _device_seen(store.manifest, job), {}, store.run_id)
            status, why = state.died_status, ""
            if status == "lost":  # the job itself ended (an exception, a kill): its log says why
                why = f" (its log: slurm/{job_id}_0_log.err)"
            if cancelled and state.state in ("CANCELLED", "COMPLETED", "UNKNOWN"):
                status, why = "cancelled", " (cancelled by amp_bench's parent: Ctrl-C)"
            row.put("SLURM's word on the job", {"status": status, "reason": f"{state.describe()} {when}{why}",
                                                "slurm_job_id": job_id, "slurm_partition": job.get("partition", "")})
            store.add(row, [], key=planning.part_key(index, case, repeat))
            written += 1
    return written


def heard_from_jobs(run_dirs, states: dict[str, job_states.JobState]) -> dict[str, job_states.JobState]:
    """SLURM's word on each job, except where SLURM does not know it (UNKNOWN: squeue and scontrol
    failed for a moment, or a cluster without accounting) while the job's own heartbeat in its run
    directory is live: that job is running. Else a case a live job is still running would be
    written off as `lost`, and `--resume` would submit it a second time."""
    out = dict(states)
    for run_dir in run_dirs:
        for beat in live_beats(run_dir):
            job_id = str(beat.get("job_id") or "")
            if job_id in out and out[job_id].state == "UNKNOWN":
                out[job_id] = job_states.JobState(job_id, "RUNNING", "SLURM did not say; its heartbeat is live",
                                                  str(beat.get("host") or ""), "heartbeat")
    return out


def _device_seen(manifest: dict, job: dict) -> DeviceInfo:
    """The device a job (or else the run) saw, for the rows it never wrote."""
    device = manifest.get("device") or {}
    name = job.get("device_name") or device.get("name") or "unknown"
    return DeviceInfo(device.get("type") or "unknown", name)


def watch(runs: list[ClusterRun], cluster: str, poll_s: float, reporter: ClusterReporter) -> None:
    """Until every job has ended: progress per partition. Ctrl-C (or SIGTERM) cancels the jobs, waits
    for them to write their rows, and re-raises."""
    ids = [j for run in runs for j in run.job_ids]
    try:
        while True:
            states = heard_from_jobs([run.store.dir for run in runs], job_states.states(ids, cluster))
            reporter.progress(runs, states)
            if not any(s.active for s in states.values()):
                break
            time.sleep(poll_s)
    except KeyboardInterrupt:
        reporter.cancelling(ids)
        job_states.cancel(ids, cluster)
        deadline = time.monotonic() + CANCEL_GRACE_S
        states = job_states.states(ids, cluster)
        while any(s.active for s in states.values()) and time.monotonic() < deadline:
            time.sleep(1.0)
            states = job_states.states(ids, cluster)
        for run in runs:
            reconcile(run.store, states, cancelled=True)
            finalize(run.store, states)
        reporter.progress(runs, states)
        raise
    for run in runs:
        reconcile(run.store, states)
        finalize(run.store, states)
    reporter.progress(runs, states)


def resume(run_dir, *, reporter: ClusterReporter | None = None, detach: bool = False) -> ClusterRun:
    """Submit again the cases of a SLURM run that have no row or whose job died; watch them unless detached."""
    reporter = reporter or ClusterReporter()
    store = RunStore.reopen(run_dir)
    manifest = store.manifest
    spec = ExecutorSpec.from_json(manifest.get("executor") or {})
    partition = (manifest.get("executor") or {}).get("partition") or (spec.partitions[0] if spec.partitions else "")
    states = heard_from_jobs([store.dir], job_states.states(list(manifest.get("jobs") or {}), spec.cluster))
    busy = [s.describe() for s in states.values() if s.active]
    if busy:
        raise UserError(f"{store.dir}: still has jobs queued or running ({'; '.join(busy[:3])}): wait for them, "
                        "or scancel them, then resume")
    reconcile(store, states)
    plan = store.read_plan()
    rows = planning.rows_by_index(store)
    todo = [i for i, _, _ in planning.plan_order(plan) if i not in rows or rows[i].get("status") in RERUN_STATUSES]
    run = ClusterRun(partition, store, [], len(plan["items"]))
    if not todo:
        finalize(store, states)
        return run
    order = [(case, repeat) for _, case, repeat in planning.plan_order(plan, todo)]
    shares = [[todo[i] for i in share] for share in share_out(order, spec.tasks)]
    part = slurm.partitions([partition], spec.cluster)[partition]
    cases = {i: c for i, c, _ in planning.plan_order(plan, todo)}
    run.job_ids, time_min, gpus = submit_share(store, spec, part, shares, cases, plan["device_type"],
                                               f"amp_bench-resume-{partition}")
    store.update_manifest(lambda m: m.setdefault("resumed", []).append(
        {"at": utc_now().isoformat(), "cases": len(todo), "jobs": run.job_ids}))
    reporter.submitted(run, spec, plan["device_type"], time_min, gpus)
    if not detach:
        watch([run], spec.cluster, spec.poll_s, reporter)
    return run
