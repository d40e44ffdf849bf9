"""Running on many machines, tested without a cluster: SLURM's answers parsed from recorded outputs,
the executor settings and their one-line errors, how cases are shared among jobs, heartbeats and run
states, several writers of one run directory, and whole runs through submitit's local executor (the
same jobs as processes here). The real-SLURM end-to-end tests are in test_slurm.py."""
import json
import os
import signal
import subprocess
import sys
import time
from multiprocessing import get_context

import pandas as pd
import pytest

from amp_bench.cli import main
from amp_bench.errors import SuiteError, UserError
from amp_bench.executors import job_states
from amp_bench.executors.job_env import StopSignals, this_job
from amp_bench.executors.slurm import Partition, parameters, partitions
from amp_bench.store.results import RunStore, read_manifest
from amp_bench.store.run_state import Heartbeat, identity, run_state
from amp_bench.studies.cluster import plan_device, share_out, time_limit_min
from amp_bench.suite import ExecutorSpec, executor_spec, load_suite
from conftest import ROOT

# Recorded on this project's one-node SLURM (Debian slurm-wlm 22.05.8, scripts/slurm_local.sh): a
# 3-task array (one pending for resources), then the same after scancel; sacct without accounting.
SQUEUE_RUNNING = "4|COMPLETED|None|vm\n6_2|PENDING|Resources|\n6_0|RUNNING|None|vm\n6_1|RUNNING|None|vm\n"
SQUEUE_CANCELLED = "6_2|CANCELLED|Resources|\n6_0|CANCELLED|None|vm\n6_1|CANCELLED|None|vm\n4|COMPLETED|None|vm\n"
SQUEUE_PENDING_ARRAY = "9_[0-2,5]|PENDING|Priority|\n"
SCONTROL_TIMELIMIT = ("JobId=3 JobName=j.sh\n   JobState=COMPLETING Reason=TimeLimit Dependency=(null)\n"
                      "   NodeList=vm\n")
SCONTROL_CANCEL = "JobId=2 JobName=j.sh\n   JobState=COMPLETING Reason=None Dependency=(null)\n   NodeList=vm\n"
SACCT_NODE_FAIL = "12_1|NODE_FAIL|None|gpu07\n12_1.batch|CANCELLED||gpu07\n13|CANCELLED by 0|None|gpu08\n"


def runner_for(outputs: dict):
    calls = []

    def run(command):
        calls.append(command[0])
        return outputs.get(command[0])
    return run, calls


def test_squeue_sacct_and_scontrol_are_read_as_slurm_says():
    states = job_states.parse_table(SQUEUE_RUNNING, "squeue")
    assert states["6_2"].queued and states["6_2"].reason == "Resources"
    assert states["6_0"].active and not states["6_0"].queued and states["6_0"].node == "vm"
    assert not states["4"].active and states["4"].died_status == "lost"  # ended without rows: lost
    assert {j: s.died_status for j, s in job_states.parse_table(SQUEUE_CANCELLED, "squeue").items()
            if j.startswith("6")} == {"6_0": "cancelled", "6_1": "cancelled", "6_2": "cancelled"}
    assert sorted(job_states.parse_table(SQUEUE_PENDING_ARRAY, "squeue")) == ["9_0", "9_1", "9_2", "9_5"]
    sacct = job_states.parse_table(SACCT_NODE_FAIL, "sacct")
    assert set(sacct) == {"12_1", "13"}  # job steps (12_1.batch) are not jobs
    assert sacct["12_1"].died_status == "node_fail" and sacct["13"].state == "CANCELLED"
    assert job_states.parse_scontrol(SCONTROL_TIMELIMIT, "3").reason == "TimeLimit"
    assert sacct["12_1"].describe() == "SLURM job 12_1 NODE_FAIL on gpu07"


def test_a_job_is_asked_of_squeue_then_sacct_then_scontrol():
    run, calls = runner_for({"squeue": SQUEUE_RUNNING, "sacct": SACCT_NODE_FAIL, "scontrol": None})
    found = job_states.query(["6_0", "12_1", "99"], run)
    assert calls == ["squeue", "sacct", "scontrol"]
    assert found["6_0"].source == "squeue" and found["12_1"].source == "sacct"
    assert found["99"].state == "UNKNOWN" and "no accounting" in found["99"].reason
    assert found["99"].died_status == "lost"
    run, calls = runner_for({"squeue": SQUEUE_RUNNING})
    job_states.query(["6_0"], run)
    assert calls == ["squeue"]  # what squeue knows is not asked again


def test_the_job_knows_itself_from_its_environment():
    job = this_job({"SLURM_JOB_ID": "17", "SLURM_ARRAY_JOB_ID": "15", "SLURM_ARRAY_TASK_ID": "2",
                    "SLURM_JOB_PARTITION": "a100", "SLURMD_NODENAME": "gpu03", "SUBMITIT_EXECUTOR": "slurm",
                    "SLURM_JOB_GPUS": "3"})
    assert job.job_id == "15_2" and job.partition == "a100" and job.node == "gpu03"
    assert job.columns() == {"slurm_job_id": "15_2", "slurm_array_job_id": "15", "slurm_array_task_id": "2",
                             "slurm_partition": "a100", "slurm_node": "gpu03", "slurm_job_gpus": "3"}
    assert this_job({"SLURM_JOB_ID": "17"}).job_id == "17"
    assert this_job({"SUBMITIT_LOCAL_JOB_ID": "4242", "SUBMITIT_EXECUTOR": "local"}).cluster == "local"
    assert this_job({}) is None


@pytest.mark.parametrize("signum, scontrol, status, words", [
    (signal.SIGTERM, SCONTROL_TIMELIMIT, "time_limit", "reached its time limit"),
    (signal.SIGTERM, SCONTROL_CANCEL, "cancelled", "was cancelled (SIGTERM"),
    (signal.SIGTERM, "JobId=5 JobState=PREEMPTED Reason=None", "preempted", "was preempted"),
    (signal.SIGUSR2, SCONTROL_CANCEL, "time_limit", "warned of its time limit"),
])
def test_a_stop_signal_becomes_a_status_with_slurms_reason(signum, scontrol, status, words):
    job = this_job({"SLURM_JOB_ID": "5", "SLURM_JOB_PARTITION": "gpu-a", "SLURMD_NODENAME": "vm"})
    stop = StopSignals(job, runner_for({"scontrol": scontrol})[0])
    stop._handle(signum, None)  # not armed: it only records
    assert stop.requested
    got, reason = stop.status_and_reason()
    assert got == status and words in reason and "SLURM job 5 (partition gpu-a, node vm)" in reason


def test_an_armed_stop_raises_at_once_so_the_worker_is_killed():
    stop = StopSignals(None)
    stop.armed = True
    with pytest.raises(KeyboardInterrupt):
        stop._handle(signal.SIGTERM, None)
    assert not stop.armed and stop.status_and_reason()[0] == "cancelled"


def _cases(groups: int, precisions=("fp32", "amp_bf16"), repeats=2):
    from amp_bench.studies.run_plan import schedule
    text = ("models: [{ref: 'python:toy_models:mlp', label: mlp}]\n"
            f"batch_sizes: {[2 ** i for i in range(groups)]}\nprecisions: {list(precisions)}\n"
            f"repeats: {repeats}\nsteps: 2\nwarmup_steps: 1\ntimeout_s: 60\nexplain: false\n")
    return text, schedule


def test_cases_are_shared_out_by_whole_groups(write_suite):
    text, schedule = _cases(groups=3)
    order = schedule(load_suite(write_suite(text)).cases("cpu"))
    shares = share_out(order, tasks=2)
    assert len(shares) == 2 and sorted(i for s in shares for i in s) == list(range(len(order)))
    for share in shares:  # each group's precisions and repeats stay in one job: one node per speedup
        groups = {order[i][0].group_id for i in share}
        assert all(sum(order[i][0].group_id == g for i in share) == 4 for g in groups)
    assert share_out(order, tasks=10) == [[i for i, (c, _) in enumerate(order) if c.group_id == g]
                                           for g in dict.fromkeys(c.group_id for c, _ in order)]
    assert time_limit_min([c for c, _ in order], ExecutorSpec()) == (12 * 60 + 600) // 60
    assert time_limit_min([c for c, _ in order], ExecutorSpec(time_min=7)) == 7


def test_auto_plans_gpu_cases_only_where_the_partition_has_gpus():
    spec = ExecutorSpec(type="slurm", partitions=("a",))
    assert plan_device("auto", Partition("a", "gpu:a100:4"), spec) == "cuda"
    assert plan_device("auto", Partition("a", ""), spec) == "cpu"
    assert plan_device("auto", Partition("a", ""), ExecutorSpec(gpus_per_node=1)) == "cuda"
    assert plan_device("cuda:1", Partition("a", ""), spec) == "cuda"
    sinfo = "gpu-a*|(null)|2\ngpu-b|(null)|2\nh100|gpu:h100:8|96\nh100|gpu:h100:4|96\n"
    found = partitions(["h100", "gpu-a"], "slurm", runner_for({"sinfo": sinfo})[0])
    assert found["h100"].has_gpus and not found["gpu-a"].has_gpus and found["gpu-a"].cpus == 2
    with pytest.raises(UserError, match=r"no partition 'v100' on this cluster \(sinfo lists: gpu-a, gpu-b, h100\)"):
        partitions(["v100"], "slurm", runner_for({"sinfo": sinfo})[0])
    with pytest.raises(UserError, match="sinfo did not answer"):
        partitions(["a"], "slurm", runner_for({})[0])


def test_sbatch_settings_reach_submitit_under_its_names():
    spec = ExecutorSpec(type="slurm", partitions=("a100",), account="lab", qos="high", constraint="a100_80g",
                        setup=("module load cuda",), sbatch={"reservation": "bench"}, tasks=3)
    params = parameters(spec, Partition("a100", "gpu:a100:4", 64), 30, 1, "amp_bench-x")
    assert params == {"name": "amp_bench-x", "timeout_min": 30, "gpus_per_node": 1, "tasks_per_node": 1,
                      "cpus_per_task": 64, "slurm_partition": "a100", "slurm_constraint": "a100_80g",
                      "slurm_account": "lab", "slurm_qos": "high", "slurm_array_parallelism": 3,
                      "slurm_setup": ["module load cuda"], "slurm_exclusive": True,
                      "slurm_additional_parameters": {"reservation": "bench"}}
    with_gres = parameters(ExecutorSpec(gres="gpu:a100:2"), Partition("a100"), 30, 1, "x")
    assert "gpus_per_node" not in with_gres and with_gres["slurm_gres"] == "gpu:a100:2"


def test_executor_settings_are_checked_with_one_line_each(write_suite, capsys):
    assert executor_spec({}, {"type": "slurm", "partitions": "a, b"}).partitions == ("a", "b")
    with pytest.raises(SuiteError) as caught:
        executor_spec({}, {"type": "slurm"}, "s.yaml")
    assert caught.value.lines == ["s.yaml: executor.partitions: missing (the slurm executor needs at least one "
                                  "partition: --slurm-partition a100,h100 or executor: {partitions: [a100, h100]})"]
    path = write_suite("models: [torchvision/resnet18]\nbatch_sizes: [2]\n"
                       "executor: {type: slurm, partitions: [a100, a100], time_min: 0, gpus: 1}\n")
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "executor.gpus: unknown key (expected one of: type, partitions" in err
    assert "executor.partitions[1]: 'a100' is listed twice" in err and "executor.time_min: expected minutes" in err
    assert "Traceback" not in err
    assert main(["run", str(write_suite("models: [torchvision/resnet18]\nbatch_sizes: [2]\n", "ok.yaml")),
                 "--executor", "slurm", "--slurm-partition", "a", "--slurm-tasks", "0"]) == 2
    assert "--slurm-tasks: expected a job count between 1 and 4096, got 0" in capsys.readouterr().err


def test_submitit_missing_is_one_line(monkeypatch):
    import builtins
    real = builtins.__import__

    def no_submitit(name, *args, **kwargs):
        if name == "submitit":
            raise ImportError(name)
        return real(name, *args, **kwargs)
    monkeypatch.setattr(builtins, "__import__", no_submitit)
    from amp_bench.executors import slurm
    with pytest.raises(UserError, match=r"needs submitit, which is not installed: pip install -e '\.\[slurm\]'"):
        slurm._submitit()


# --------------------------------------------------------------------------- heartbeats and run states

def _run_dir(tmp_path, **manifest):
    store = RunStore(tmp_path, "20261201T000000Z-host-cpu")
    store.write_manifest(run_id=store.run_id, kind="benchmark", status="running", cases_planned=2, **manifest)
    return store


def test_a_live_parent_is_running_and_a_killed_one_interrupted(tmp_path):
    store = _run_dir(tmp_path)
    with Heartbeat(store.dir, "parent", case="mlp-bs2-fp32 r0"):
        state = run_state(store.dir)
        assert state.state == "running" and "mlp-bs2-fp32 r0" in state.detail
    # a parent that was SIGKILLed: its heartbeat names a process that is gone
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    beat = {"name": "parent", **identity(proc.pid), "at": "2026-12-01T00:00:00+00:00"}
    (store.dir / "heartbeats" / "parent.json").write_text(json.dumps(beat))
    assert run_state(store.dir).state == "running"  # alive on this host: running, however old the beat
    proc.kill()
    proc.wait()
    state = run_state(store.dir)
    assert state.state == "interrupted" and f"pid {proc.pid}" in state.detail and "0 of 2" in state.detail
    store.write_manifest(status="complete")
    assert run_state(store.dir).state == "complete"


def test_another_hosts_heartbeat_counts_until_it_is_stale(tmp_path):
    import datetime as dt
    store = _run_dir(tmp_path)
    now = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.timezone.utc)
    beat = {"name": "job-7", "host": "gpu07", "boot_id": "x", "pid": 1, "pid_start": 1, "job_id": "7"}
    (store.dir / "heartbeats").mkdir()
    (store.dir / "heartbeats" / "job-7.json").write_text(json.dumps({**beat, "at": "2026-12-01T11:59:30+00:00"}))
    assert run_state(store.dir, now=now).state == "running"
    (store.dir / "heartbeats" / "job-7.json").write_text(json.dumps({**beat, "at": "2026-12-01T11:50:00+00:00"}))
    state = run_state(store.dir, now=now)
    assert state.state == "interrupted" and "no heartbeat from gpu07 since" in state.detail


def test_a_slurm_run_whose_jobs_never_started_is_queued_and_old_runs_unknown(tmp_path):
    store = _run_dir(tmp_path, executor={"type": "slurm", "partition": "a100"}, jobs={"41_0": {}, "41_1": {}})
    state = run_state(store.dir)
    assert state.state == "queued" and state.waiting_jobs == ["41_0", "41_1"]
    old = _run_dir(tmp_path / "old")
    assert run_state(old.dir).state == "unknown"  # written before heartbeats: not called interrupted


def test_rows_for_jobs_that_ended_without_writing_them_say_what_slurm_said(tmp_path, write_suite):
    """A node that died (NODE_FAIL) or a job cancelled while queued wrote no rows: reconcile writes
    them from SLURM's state; a job still running is left alone; a finished job's rows are kept."""
    from amp_bench.executors.job_states import JobState
    from amp_bench.studies.cluster import finalize, reconcile
    from amp_bench.studies.run_plan import make_plan, part_key, schedule
    text, _ = _cases(groups=3, precisions=("fp32",), repeats=1)
    order = schedule(load_suite(write_suite(text)).cases("cpu"))
    store = _run_dir(tmp_path, executor={"type": "slurm", "partition": "a100"},
                     device={"name": "NVIDIA A100-SXM4-80GB", "type": "cuda"},
                     jobs={"7_0": {"indices": [0], "partition": "a100"}, "7_1": {"indices": [1], "partition": "a100"},
                           "7_2": {"indices": [2], "partition": "a100"}})
    store.write_manifest(cases_planned=3)
    store.write_plan(make_plan(order, "cuda", "auto"))
    case, repeat = order[0]
    store.add({"run_id": store.run_id, "case_id": case.case_id, "status": "ok", "repeat": 0}, [],
              key=part_key(0, case, repeat))
    (store.dir / "heartbeats" / "job-7_1.json").parent.mkdir(exist_ok=True)
    (store.dir / "heartbeats" / "job-7_1.json").write_text(json.dumps({"job_id": "7_1", "ended_at": "x"}))
    states = {"7_0": JobState("7_0", "COMPLETED"), "7_1": JobState("7_1", "NODE_FAIL", "None", "gpu07"),
              "7_2": JobState("7_2", "PENDING", "Priority")}
    assert reconcile(store, states) == 1  # 7_2 is still queued: its case waits
    rows = pd.read_csv(store.dir / "results.csv").set_index("case_id")
    died = rows.loc[order[1][0].case_id]
    assert died["status"] == "node_fail"
    assert died["reason"] == "SLURM job 7_1 NODE_FAIL on gpu07 before this case finished"
    assert died["slurm_job_id"] == "7_1" and died["device_name"] == "NVIDIA A100-SXM4-80GB"
    assert rows.loc[order[0][0].case_id, "status"] == "ok"
    assert finalize(store, states) == "running"  # a job may still write
    states["7_2"] = JobState("7_2", "CANCELLED")
    assert reconcile(store, states, cancelled=True) == 1
    rows = pd.read_csv(store.dir / "results.csv").set_index("case_id")
    assert rows.loc[order[2][0].case_id,
                    "reason"].endswith("before it started (cancelled by amp_bench's parent: Ctrl-C)")
    assert finalize(store, states) == "interrupted"
    assert "--resume" in read_manifest(store.dir)["interrupted_reason"]


def _write_rows(run_dir, worker, n):
    store = RunStore.reopen(run_dir)
    for i in range(n):
        store.add({"run_id": store.run_id, "case_id": f"case-{worker}-{i}", "status": "ok", "repeat": 0},
                  [{"run_id": store.run_id, "case_id": f"case-{worker}-{i}", "step": 0, "step_time_ms": 1.0}],
                  key=f"{worker:02d}{i:03d}")


def test_several_writers_of_one_run_lose_no_row_and_a_rewritten_part_replaces(tmp_path):
    store = _run_dir(tmp_path)
    context = get_context("spawn")
    procs = [context.Process(target=_write_rows, args=(str(store.dir), w, 15)) for w in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    table = pd.read_csv(store.dir / "results.csv")
    assert len(table) == 45 and table["case_id"].is_unique
    assert len(pd.read_csv(store.dir / "samples.csv")) == 45
    again = RunStore.reopen(store.dir)
    again.add({"run_id": store.run_id, "case_id": "case-1-3", "status": "error", "repeat": 0}, [], key="01003")
    table = pd.read_csv(store.dir / "results.csv")
    assert len(table) == 45 and table.loc[table["case_id"] == "case-1-3", "status"].tolist() == ["error"]
    assert len(pd.read_csv(store.dir / "samples.csv")) == 44  # its old samples went with it
    again.write_manifest(note="a")
    RunStore.reopen(store.dir).write_manifest(other="b")
    assert {"note", "other"} <= set(read_manifest(store.dir))  # two writers' fields both kept


# --------------------------------------------------------------------------- whole runs, submitit's local executor

SUITE = ("models: [{ref: 'python:toy_models:mlp', label: mlp}, {ref: 'python:toy_models:mlp', label: wide, "
         "options: {hidden: 64}}]\nbatch_sizes: [4]\nprecisions: [fp32, tf32]\nrepeats: 1\nsteps: 3\n"
         "warmup_steps: 1\ntimeout_s: 120\nexplain: false\n")


def cli(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "amp_bench", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "COLUMNS": "200"})


@pytest.mark.slow
def test_a_suite_through_submitits_local_executor_writes_rows_from_its_jobs(write_suite, tmp_path):
    path = write_suite(SUITE)
    proc = cli("run", str(path), "--executor", "slurm", "--slurm-cluster", "local", "--slurm-partition", "gpu-a",
               "--precision", "fp32", "--precision", "amp_bf16", "--allow-emulated",  # two modes run on any CPU
               "--slurm-tasks", "2", "--slurm-time", "10", "--results-dir", str(tmp_path / "results"),
               "--reports-dir", str(tmp_path / "reports"), "--target", "none")  # it reads no GPU prediction
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_dir,) = list((tmp_path / "results").iterdir())
    manifest = read_manifest(run_dir)
    assert manifest["status"] == "complete" and manifest["executor"]["partition"] == "gpu-a"
    assert len(manifest["jobs"]) == 2  # two jobs, each a whole model's group
    table = pd.read_csv(run_dir / "results.csv")
    assert len(table) == 4 and set(table["slurm_partition"]) == {"gpu-a"}
    assert table["slurm_job_id"].astype(str).isin(manifest["jobs"]).all()
    for _, rows in table.groupby("group_id"):
        assert rows["slurm_job_id"].nunique() == 1  # a group's fp32 and bf16 from one job
    for job in manifest["jobs"].values():
        assert job["device_name"] and job["node"] and job["ended_at"]
        assert job["workers"]["mode"] == "fork"  # each job forks its workers from a server of its own
    assert set(table["worker_start"]) == {"fork"}
    assert set(table["interleave"]) == {"steps"}  # and runs a CPU repeat's modes as a lockstep set
    assert "gpu-a: jobs queued" in proc.stdout and "report: " in proc.stdout
    status = cli("status", str(tmp_path / "results"))
    assert status.returncode == 0 and "complete" in status.stdout and "slurm gpu-a" in status.stdout


@pytest.mark.slow
def test_a_killed_local_parent_is_interrupted_and_resume_runs_only_what_is_missing(write_suite, tmp_path):
    # each case takes a second (a forked worker starts in a tenth of one): the kill lands between them
    path = write_suite(SUITE.replace("repeats: 1", "repeats: 2").replace(
        ", {ref: 'python:toy_models:mlp', label: wide, options: {hidden: 64}}", "").replace(
        "{ref: 'python:toy_models:mlp', label: mlp}",
        "{ref: 'python:toy_models:sleepy', label: mlp, options: {ms: 250}}"))
    results = tmp_path / "results"
    parent = subprocess.Popen([sys.executable, "-m", "amp_bench", "run", str(path), "--precision", "fp32",
                               "--results-dir", str(results), "--no-report"], cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not list(results.glob("*/parts/*.json")):
        time.sleep(0.2)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    (run_dir,) = list(results.iterdir())
    status = cli("status", str(results))  # the kill may fall between a part and its table: status catches up
    assert "interrupted" in status.stdout and f"pid {parent.pid}" in status.stdout, status.stdout
    before = pd.read_csv(run_dir / "results.csv")
    assert len(before) == 1
    assert read_manifest(run_dir)["status"] == "running"  # the manifest never heard: the state is derived
    from amp_bench.report import build_report
    page = build_report([run_dir], tmp_path / "r.html", formats=("html", "md"))["html"].read_text()
    assert f"Run {run_dir.name} did not finish (interrupted: its writer (pid {parent.pid}" in page
    resumed = cli("run", "--resume", str(run_dir), "--no-report")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    after = pd.read_csv(run_dir / "results.csv")
    assert len(after) == 2 and (after["status"] == "ok").all()
    kept = after.merge(before, on=["case_id", "repeat"], suffixes=("", "_before"))
    assert (kept["timestamp"] == kept["timestamp_before"]).all()  # the finished cases were not run again
    manifest = read_manifest(run_dir)
    assert manifest["status"] == "complete" and manifest["resumed"][0]["cases"] == 1
    again = cli("run", "--resume", str(run_dir), "--no-report")
    assert again.returncode == 0 and len(pd.read_csv(run_dir / "results.csv")) == 2
    assert "--resume RUN_DIR takes no suite" in cli("run", str(path), "--resume", str(run_dir)).stderr


@pytest.mark.slow
def test_fidelity_on_a_partition_is_one_job_that_runs_the_whole_study(tmp_path):
    proc = cli("fidelity", "suites/fidelity.yaml", "--slurm-cluster", "local", "--slurm-partition", "gpu-a",
               "--epochs", "1", "--seed", "0", "--precision", "fp32", "--results-dir", str(tmp_path / "results"),
               "--no-report")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_dir,) = [d for d in (tmp_path / "results").iterdir() if not d.name.startswith(".")]
    assert f"gpu-a -> {run_dir}" in proc.stdout.replace("\n", "")
    manifest = read_manifest(run_dir)
    assert manifest["kind"] == "fidelity" and manifest["executor"]["partition"] == "gpu-a"
    assert manifest["job"]["cluster"] == "local" and manifest["job"]["job_id"]
    assert (pd.read_csv(run_dir / "fidelity.csv")["status"] == "ok").all()


def test_a_job_slurm_cannot_name_but_whose_heartbeat_is_live_is_running(tmp_path):
    """squeue and scontrol failing for a moment (UNKNOWN) must not end a job that is still beating:
    its cases would be written off as lost and resubmitted by --resume while it runs them."""
    from amp_bench.executors.job_states import JobState
    from amp_bench.studies.cluster import heard_from_jobs
    store = _run_dir(tmp_path)
    unknown = {j: JobState(j, "UNKNOWN", "SLURM no longer knows this job") for j in ("41", "42")}
    with Heartbeat(store.dir, "job-41", job_id="41"):
        states = heard_from_jobs([store.dir], unknown)
        assert states["41"].active and states["41"].source == "heartbeat"
        assert not states["42"].active  # no heartbeat: SLURM's word stands
    assert not heard_from_jobs([store.dir], unknown)["41"].active  # its heartbeat ended with it
    done = {"41": JobState("41", "COMPLETED")}
    with Heartbeat(store.dir, "job-41", job_id="41"):
        assert heard_from_jobs([store.dir], done)["41"].state == "COMPLETED"  # SLURM's own end is kept


def test_the_software_record_is_taken_beside_the_probe_and_done_before_any_case(monkeypatch, tmp_path):
    """pip freeze and git run while the probe worker imports torch, and are over when probe() returns:
    never beside a case's measured window."""
    import threading

    from amp_bench.launchers.process import WorkerOutcome
    from amp_bench.studies import session
    order = []

    def slow_record():
        time.sleep(0.3)
        order.append("software")
        return {"pip_freeze": ["torch==2.14.1"], "git_commit": "abc"}

    def probe_worker(args, result_path, log_path, timeout_s, server=None):
        order.append("probe")
        return WorkerOutcome({"device": {"type": "cpu", "name": "cpu"}}, 0, False, None, 0.1, log_path)
    monkeypatch.delenv("AMP_BENCH_PROBE_CACHE", raising=False)  # this fake probe is never kept
    monkeypatch.setattr(session, "software_record", slow_record)
    monkeypatch.setattr(session, "launch", probe_worker)
    probed = session.probe("cpu")
    assert order == ["probe", "software"]  # side by side: the probe did not wait for the record to start
    assert probed["software"]["pip_freeze"] == ["torch==2.14.1"] and probed["device"]["type"] == "cpu"
    assert not [t for t in threading.enumerate() if t.name == "amp_bench-software-record"]


@pytest.mark.slow
def test_slurm_options_on_a_local_run_are_said_not_to_apply(write_suite, tmp_path):
    proc = cli("run", str(write_suite(SUITE)), "--precision", "fp32", "--slurm-qos", "high", "--slurm-time", "5",
               "--results-dir", str(tmp_path / "results"), "--no-report")
    assert proc.returncode == 0, proc.stderr
    assert "note: --slurm-qos, --slurm-time apply to --executor slurm only; this run is local: not used" in \
        proc.stdout.replace("\n", " ")
