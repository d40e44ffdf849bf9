"""`fidelity` and `headroom` on SLURM partitions: one job per partition runs the whole study on its
node, exactly as a local run does (a fresh worker per precision and seed, or per probe), into its own
run directory in the results root; the job's identity goes into that run's manifest.

Why one job per study and not a plan shared among jobs as `run` has (studies/cluster.py): a
fidelity study compares precisions trained from the same seeds on one GPU, and a headroom search
probes one GPU's memory; both are one machine's answer, so a partition gets one job.
"""
from __future__ import annotations

import pickle
import time
from pathlib import Path

from amp_bench.executors import job_states, slurm
from amp_bench.executors.job_env import this_job
from amp_bench.store.results import RunStore
from amp_bench.studies.cluster import CANCEL_GRACE_S, plan_device
from amp_bench.suite import ExecutorSpec, load_suite

STUDY_TIME_MIN = 120  # a study job's time limit when none is given (its probes and seeds vary too much to add up)


def study_job(kind: str, path: str, device: str | None, results_dir: str, overrides: dict, partition: str) -> str:
    """What a study's job runs on its node: the study, then its identity into the run's manifest.
    Returns the run directory."""
    if kind == "fidelity":
        from amp_bench.studies.fidelity.orchestration import run_fidelity as run
    else:
        from amp_bench.studies.headroom_search import run_headroom as run
    run_dir = run(path, device=device, results_dir=results_dir, **overrides).attrs["run_dir"]
    job = this_job()
    RunStore.reopen(run_dir).write_manifest(executor={"type": "slurm", "partition": partition,
                                                      "cluster": job.cluster if job else ""},
                                            job=job.to_json() if job else {})
    return run_dir


def run_study_on_cluster(kind: str, path, spec: ExecutorSpec, *, device: str | None = None, results_dir="results",
                         detach: bool = False, say=print, **overrides) -> dict[str, str]:
    """Submit the study to every partition of `spec`; unless detached, wait and return {partition:
    run directory} (detached: {partition: job id}). `say` gets a line per change of a job's state."""
    suite = load_suite(path)
    partitions = slurm.partitions(list(spec.partitions), spec.cluster)
    results_dir = str(Path(results_dir).resolve())
    jobs = {}
    for name, partition in partitions.items():
        device_type = plan_device(device or suite.device, partition, spec)
        gpus = spec.gpus_per_node if spec.gpus_per_node is not None else (1 if device_type == "cuda" else 0)
        folder = Path(results_dir) / ".slurm" / f"{kind}-{name}"
        (job_id,) = slurm.submit(spec, partition, folder, study_job,
                                 [(kind, str(Path(path).resolve()), device_type, results_dir, overrides, name)],
                                 spec.time_min or STUDY_TIME_MIN, gpus, f"amp_bench-{kind}-{name}")
        jobs[name] = (job_id, folder)
        say(f"{name}: {kind} for {device_type} submitted as job {job_id} (logs: {folder})")
    if detach:
        return {name: job_id for name, (job_id, _) in jobs.items()}
    return _wait(jobs, spec, say)


def _wait(jobs: dict[str, tuple[str, Path]], spec: ExecutorSpec, say) -> dict[str, str]:
    ids = [job_id for job_id, _ in jobs.values()]
    last: dict[str, str] = {}
    try:
        while True:
            states = job_states.states(ids, spec.cluster)
            for name, (job_id, _) in jobs.items():
                if states[job_id].state != last.get(name):
                    last[name] = states[job_id].state
                    say(f"{name}: {states[job_id].describe()}")
            if not any(s.active for s in states.values()):
                break
            time.sleep(spec.poll_s)
    except KeyboardInterrupt:
        say(f"cancelling {len(ids)} job(s): {', '.join(ids)}")
        job_states.cancel(ids, spec.cluster)
        deadline = time.monotonic() + CANCEL_GRACE_S
        while time.monotonic() < deadline and any(s.active for s in job_states.states(ids, spec.cluster).values()):
            time.sleep(1.0)
        raise
    return {name: _outcome(job_id, folder) for name, (job_id, folder) in jobs.items()}


def _outcome(job_id: str, folder: Path) -> str:
    """The run directory the job returned, or why there is none (submitit's result file:
    ("success", value) or ("error", traceback))."""
    path = folder / f"{job_id}_0_result.pkl"
    try:
        outcome, value = pickle.loads(path.read_bytes())
    except (OSError, ValueError, EOFError, pickle.UnpicklingError):
        return f"no result from job {job_id} (see {folder})"
    if outcome != "success":
        last = [line for line in str(value).splitlines() if line.strip()][-1:] or ["failed"]
        return f"job {job_id} failed: {last[0]} (see {folder})"
    return str(value)
