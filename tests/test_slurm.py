"""On a real SLURM: the project's one-node cluster (scripts/slurm_local.sh: Debian's slurm-wlm, partitions
gpu-a and gpu-b standing in for two GPU types). .ci/run starts it; without sbatch these tests skip,
and tests/test_cluster.py covers the same code through submitit's local executor."""
import os
import shutil
import subprocess
import sys
import time

import pandas as pd
import pytest

from amp_bench.store.results import read_manifest
from conftest import ROOT

pytestmark = pytest.mark.slow


def _slurm_up() -> bool:
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%P %t"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and "gpu-a" in out.stdout and "gpu-b" in out.stdout


@pytest.fixture(scope="module")
def slurm():
    if not _slurm_up():
        if shutil.which("sbatch") is None or os.geteuid() != 0:
            pytest.skip("no SLURM here (root runs scripts/slurm_local.sh start; .ci/run does)")
        subprocess.run(["bash", str(ROOT / "scripts" / "slurm_local.sh"), "start"], check=True, timeout=300)
    assert _slurm_up()


def cli(*args, timeout=900):
    return subprocess.run([sys.executable, "-m", "amp_bench", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "COLUMNS": "200"})


def test_smoke_on_two_partitions_is_two_runs_and_one_report_of_both(slurm, tmp_path):
    proc = cli("run", "suites/smoke.yaml", "--executor", "slurm", "--slurm-partition", "gpu-a,gpu-b",
               "--precision", "fp32", "--precision", "tf32", "--steps", "2", "--warmup-steps", "1", "--no-explain",
               # both partitions at once: plumbing
               "--no-report", "--no-slurm-exclusive", "--slurm-cpus-per-task", "1", "--repeats", "1",
               "--results-dir", str(tmp_path / "results"), "--reports-dir", str(tmp_path / "reports"),
               "--target", "none")  # it reads no GPU prediction
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runs = sorted((tmp_path / "results").iterdir())
    assert [r.name.split("-", 1)[1] for r in runs] == ["gpu-a-cpu", "gpu-b-cpu"]  # named by partition
    for run_dir, partition in zip(runs, ("gpu-a", "gpu-b"), strict=True):
        manifest = read_manifest(run_dir)
        assert manifest["status"] == "complete" and manifest["executor"]["partition"] == partition
        (job_id, job), = manifest["jobs"].items()
        assert job_id.isdigit() and job["node"] and job["device_name"] and job["partition"] == partition
        table = pd.read_csv(run_dir / "results.csv")
        assert len(table) == 4 and set(table["slurm_partition"]) == {partition}
        assert set(table["slurm_job_id"].astype(str)) == {job_id} and table["slurm_node"].notna().all()
        assert (table.loc[table["precision"] == "fp32", "status"] == "ok").all()
        assert (table.loc[table["precision"] == "tf32", "status"] == "unsupported").all()  # gated on the node
    report = cli("report", str(tmp_path / "results"), "-o", str(tmp_path / "all.html"))
    assert report.returncode == 0, report.stderr
    page = (tmp_path / "all.html").read_text()
    section = page.split("id='machines'", 1)[1].split("<h2", 1)[0]
    assert "GPUs compared" in page and "[gpu-a]" in section and "[gpu-b]" in section


SLOW_SUITE = ("models: [{ref: 'python:toy_models:sleeps', label: napper, options: {seconds: 0.4}}]\n"
              "batch_sizes: [2]\nprecisions: [fp32]\nrepeats: 3\nwarmup_steps: 1\nsteps: 5\ntimeout_s: 120\n"
              "explain: false\n")


def _wait(predicate, timeout=180, every=0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError("timed out waiting")


def test_detach_status_scancel_and_resume(slurm, write_suite, tmp_path):
    """--detach returns at once; status shows the job; scancel of the running job leaves a row that
    says so (status and SLURM's reason); --resume runs only what the cancel left."""
    path = write_suite(SLOW_SUITE)
    results = tmp_path / "results"
    proc = cli("run", str(path), "--slurm-partition", "gpu-b", "--detach", "--results-dir", str(results))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "detached: `python -m amp_bench status" in proc.stdout
    (run_dir,) = list(results.iterdir())
    (job_id,) = read_manifest(run_dir)["jobs"]
    status = cli("status", str(results))  # SLURM's word on the job beside the files'
    assert status.returncode == 0 and any(w in status.stdout for w in ("1 PENDING", "1 RUNNING")), status.stdout
    assert any(word in status.stdout for word in ("queued", "running")), status.stdout
    _wait(lambda: list(run_dir.glob("parts/*.json")))  # the first case finished: the job is mid-run
    subprocess.run(["scancel", job_id], check=True, timeout=30)
    _wait(lambda: "CANCELLED" in subprocess.run(["squeue", "--states=all", "-h", "-o", "%i %T"], capture_output=True,
                                                 text=True).stdout.split(job_id, 1)[-1][:20])
    _wait(lambda: len(pd.read_csv(run_dir / "results.csv")) == 3)  # the job wrote rows for all it had
    table = pd.read_csv(run_dir / "results.csv")
    cancelled = table[table["status"] == "cancelled"]
    assert not cancelled.empty and (table["status"] == "ok").any()
    assert cancelled["reason"].str.contains(f"SLURM job {job_id} (partition gpu-b", regex=False).all()
    assert cancelled["reason"].str.contains("was cancelled").all()
    status = cli("status", str(results))
    assert "interrupted" in status.stdout and "--resume" in status.stdout, status.stdout
    ok_before = table[table["status"] == "ok"][["case_id", "repeat", "timestamp"]]
    resumed = cli("run", "--resume", str(run_dir), "--no-report")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    after = pd.read_csv(run_dir / "results.csv")
    assert len(after) == 3 and (after["status"] == "ok").all()
    kept = ok_before.merge(after, on=["case_id", "repeat"], suffixes=("", "_after"))
    assert (kept["timestamp"] == kept["timestamp_after"]).all()  # finished cases were not run again
    manifest = read_manifest(run_dir)
    assert manifest["status"] == "complete" and len(manifest["jobs"]) == 2
    assert manifest["resumed"][0]["cases"] == len(cancelled)
