"""AMP under DDP with torchrun: suite keys, launch command, per-rank aggregation, failure
explanations (unit tests), and real 2-process gloo runs on the CPU (slow)."""
import json
import math
import time
from pathlib import Path

import pandas as pd
import pytest

import amp_bench
from amp_bench.analysis.speedups import summarize
from amp_bench.cli import main as cli_main
from amp_bench.errors import SuiteError
from amp_bench.launchers import torchrun
from amp_bench.launchers.launch import base_row
from amp_bench.launchers.process import processes_with_token
from amp_bench.measure import ddp
from amp_bench.platform.device import DeviceInfo
from amp_bench.suite import load_suite
from conftest import processes_with

DDP_SUITE = """
models: [python:toy_models:mlp]
batch_sizes: [8]
precisions: [fp32, amp_bf16]
allow_emulated: true  # bf16 runs on every CPU (emulated where it has no bf16 ISA)
nproc_per_node: [1, 2]
threads_per_rank: 1
warmup_steps: 2
steps: 8
timeout_s: 120
explain: false
"""


def _problems(write_suite, text):
    with pytest.raises(SuiteError) as info:
        load_suite(write_suite(text)).cases("cpu")
    return info.value.lines


# --------------------------------------------------------------------------- suite keys

def test_nproc_per_node_is_a_matrix_axis_and_names_the_case(write_suite):
    suite = load_suite(write_suite(DDP_SUITE))
    cases = suite.cases("cpu")
    assert [(c.nproc_per_node, c.precision) for c in cases] == [
        (1, "fp32"), (1, "amp_bf16"), (2, "fp32"), (2, "amp_bf16")]
    assert [c.case_id for c in cases][:3] == ["mlp-bs8-np1-fp32", "mlp-bs8-np1-amp_bf16", "mlp-bs8-np2-fp32"]
    assert all(c.distributed and c.threads_per_rank == 1 for c in cases)
    assert cases[2].world_size == 2
    # a suite without nproc_per_node keeps its single-process cases and their ids
    plain = load_suite(write_suite(DDP_SUITE.replace("nproc_per_node: [1, 2]\n", ""))).cases("cpu")
    assert [c.case_id for c in plain] == ["mlp-bs8-fp32", "mlp-bs8-amp_bf16"]
    assert not plain[0].distributed and plain[0].world_size == 1
    # and overrides (the CLI's --nproc-per-node) go through the same checks
    assert {c.nproc_per_node for c in suite.cases("cpu", {"nproc_per_node": [4]})} == {4}
    round_trip = type(cases[2]).from_json(json.loads(json.dumps(cases[2].to_json())))
    assert round_trip == cases[2]


def test_a_model_can_ask_for_its_own_process_counts(write_suite):
    suite = load_suite(write_suite(DDP_SUITE.replace("nproc_per_node: [1, 2]\n", "").replace(
        "models: [python:toy_models:mlp]",
        "models: [python:toy_models:mlp, {ref: 'python:toy_models:mlp', label: mlp-ddp, nproc_per_node: 1}]")))
    ids = [c.case_id for c in suite.cases("cpu")]
    assert ids == ["mlp-bs8-fp32", "mlp-bs8-amp_bf16", "mlp-ddp-bs8-np1-fp32", "mlp-ddp-bs8-np1-amp_bf16"]
    case = suite.cases("cpu")[2]
    assert type(case).from_json(json.loads(json.dumps(case.to_json()))) == case


@pytest.mark.parametrize("extra, expected", [
    ("nproc_per_node: 0\n", "nproc_per_node: expected a process count between 1 and 1024, got 0"),
    ("nproc_per_node: [2, 2]\n", "nproc_per_node[1]: duplicate case"),
    ("nproc_per_node: two\n", "nproc_per_node: expected a process count between 1 and 1024, got 'two'"),
    ("nproc_per_node: 2\nnnodes: 0\n", "nnodes: expected a node count between 1 and 1024, got 0"),
    ("nproc_per_node: 2\nnnodes: 2\n", "rdzv_endpoint: missing: nnodes: 2 needs the HOST:PORT"),
    ("nnodes: 2\nrdzv_endpoint: 'node0:29500'\n", "nnodes: 2 nodes need nproc_per_node"),
    ("nproc_per_node: 2\nnnodes: 2\nrdzv_endpoint: node0\n", "rdzv_endpoint: expected HOST:PORT"),
    ("nproc_per_node: 2\ndist_backend: mpi\n", "dist_backend: expected one of auto, gloo, nccl, got 'mpi'"),
    ("nproc_per_node: 2\nthreads_per_rank: 0\n", "threads_per_rank: expected a thread count between 1"),
    ("nproc_per_node: 2\nrdzv_id: 'a b'\n", "rdzv_id: expected a job id"),
])
def test_bad_distributed_settings_get_one_line_each(write_suite, extra, expected):
    base = DDP_SUITE.replace("nproc_per_node: [1, 2]\n", "")
    lines = _problems(write_suite, base + extra)
    assert len(lines) == 1 and expected in lines[0], lines
    assert lines[0].startswith(str(write_suite(base + extra)))


def test_multi_node_settings_reach_the_torchrun_command(write_suite):
    suite = load_suite(write_suite(DDP_SUITE.replace("[1, 2]", "4") + "nnodes: 2\nrdzv_endpoint: 'node0:29500'\n"))
    case = suite.cases("cpu")[0]
    assert case.world_size == 8 and case.case_id == "mlp-bs8-2x4-fp32"
    command = torchrun.launch_command(case, "job-1", "run/work/job-1")
    assert command[1:4] == ["-m", "amp_bench.launchers.torchrun", "launch"]
    assert {"--nproc-per-node=4", "--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=node0:29500",
            "--rdzv-id=job-1", "--max-restarts=0", "--log-dir=run/work/job-1"} <= set(command)
    assert "--standalone" not in command and command[-2:] == ["-m", "amp_bench.worker"]
    single = torchrun.launch_command(load_suite(write_suite(DDP_SUITE)).cases("cpu")[2], "x", "logs")
    assert "--standalone" in single and "--nproc-per-node=2" in single


def test_threads_per_rank_share_the_cores_unless_given(write_suite):
    cases = load_suite(write_suite(DDP_SUITE.replace("threads_per_rank: 1\n", ""))).cases("cpu")
    assert ddp.threads_per_rank(cases[2], cpu_count=16) == 8  # two ranks
    assert ddp.threads_per_rank(cases[0], cpu_count=16) == 16
    assert ddp.threads_per_rank(cases[2], cpu_count=1) == 1
    given = load_suite(write_suite(DDP_SUITE)).cases("cpu")[2]
    assert ddp.threads_per_rank(given, cpu_count=16) == 1
    assert torchrun.launch_env(given)["OMP_NUM_THREADS"] == "1"


# --------------------------------------------------------------------------- aggregation

def test_slowest_rank_per_step():
    assert ddp.slowest_per_step([[1.0, 5.0, 2.0], [3.0, 1.0, 2.5]]) == [3.0, 5.0, 2.5]
    assert ddp.slowest_per_step([[4.0, 2.0]]) == [4.0, 2.0]
    with pytest.raises(ValueError, match="same number of steps"):
        ddp.slowest_per_step([[1.0, 2.0], [1.0]])


def _record(times, window_s, **extra):
    samples = [{"phase": "warmup", "step": 0, "step_time_ms": None, "loss": 2.0}] + [
        {"phase": "measure", "step": i + 1, "step_time_ms": t, "loss": 1.0} for i, t in enumerate(times)]
    return {"status": "ok", "reason": "", "samples": samples, "window_s": window_s, "warnings": "",
            "throughput": 0.0, **extra}


def test_aggregate_is_the_job_view(write_suite):
    case = load_suite(write_suite(DDP_SUITE)).cases("cpu")[2]  # np2, batch 8, 8 steps
    case = type(case).from_json({**case.to_json(), "steps": 3})
    records = [_record([10.0, 30.0, 20.0], 0.065, rss_hwm_bytes=100, energy_j=2.0, sm_clock_mhz_min=1500,
                       warnings="20% of the measured window fell between steps"),
               _record([15.0, 25.0, 20.0], 0.070, rss_hwm_bytes=300, energy_j=3.0, sm_clock_mhz_min=1400)]
    row = ddp.aggregate(records, case)
    measured = [s["step_time_ms"] for s in row["samples"] if s["phase"] == "measure"]
    assert measured == [15.0, 30.0, 20.0]
    assert row["step_time_ms_median"] == 20.0 and row["step_time_ms_max"] == 30.0
    assert row["window_s"] == 0.070
    assert row["throughput"] == pytest.approx(2 * 8 * 3 / 0.070)  # global samples/s
    assert row["rss_hwm_bytes"] == 300 and row["energy_j"] == 5.0 and row["sm_clock_mhz_min"] == 1400
    assert row["energy_j_per_sample"] == pytest.approx(5.0 / 48)
    assert row["rank_step_time_ms_medians"] == "20 20"
    assert "rank 0: 20% of the measured window" in row["warnings"]
    records[1]["status"], records[1]["reason"] = "nonfinite", "loss is nan at step 2"
    assert ddp.aggregate(records, case)["reason"] == "rank 1: loss is nan at step 2"
    # what the job was planned as is the parent's to write, once: the ranks' record leaves it alone
    assert not {"world_size", "nnodes", "global_batch_size", "dist_backend", "scaling"} & set(row)
    planned = base_row(case, 0, DeviceInfo("cpu", "cpu"), {}, "run")
    assert planned["world_size"] == 2 and planned["global_batch_size"] == 16 and planned["dist_backend"] == "gloo"
    assert planned["scaling"].startswith("weak")


TORCHRUN_FAILURE = """
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
amp_bench.worker FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-30_00:41:02
  host      : vm
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 100)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-30_00:41:02
  host      : vm
  rank      : 1 (local_rank: 1)
  exitcode  : {code} (pid: 101)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 101
============================================================
"""


def test_the_failed_rank_is_named(tmp_path):
    result = tmp_path / "case.result.json"
    assert torchrun.torchrun_exits(TORCHRUN_FAILURE.replace("{code}", "-9")) == {0: 1, 1: -9}
    # rank 0 only lost its peer: the silent rank 1 is the cause
    (tmp_path / "case.result.json.rank0").write_text(json.dumps(
        {"status": "error", "reason": "RuntimeError: Connection closed by peer [127.0.0.1]:1234", "rank": 0,
         "failed_at": 1.0}))
    status, reason = torchrun.explain_failure(result, TORCHRUN_FAILURE.replace("{code}", "-9"), 2)
    assert status == "oom" and reason.startswith("rank 1 of 2 was killed by SIGKILL")
    status, reason = torchrun.explain_failure(result, TORCHRUN_FAILURE.replace("{code}", "-11"), 2)
    assert status == "error" and "rank 1 of 2 was killed by SIGSEGV" in reason
    # a rank that reported its own failure (an exception, an allocator OOM) is named with its reason
    (tmp_path / "case.result.json.rank0").unlink()
    (tmp_path / "case.result.json.rank1").write_text(json.dumps(
        {"status": "oom", "reason": "RuntimeError: can't allocate memory", "rank": 1, "failed_at": 2.0}))
    log = TORCHRUN_FAILURE.replace("{code}", "1").replace("rank      : 0 (local_rank: 0)\n  exitcode  : 1",
                                                          "rank      : 0 (local_rank: 0)\n  exitcode  : -15")
    assert torchrun.explain_failure(result, log, 2) == ("oom", "rank 1 of 2: RuntimeError: can't allocate memory")
    assert torchrun.explain_failure(tmp_path / "other.json", "no summary", 2) is None


def test_scaling_efficiency_pairs_each_world_size_with_one_process():
    rows = []
    for world, precision, ms in [(1, "fp32", 10.0), (1, "amp_bf16", 5.0), (2, "fp32", 12.5), (2, "amp_bf16", 8.0),
                                 (4, "fp32", 20.0)]:
        rows.append({"run_id": "r", "suite": "s", "model_label": "m", "batch_size": 8, "image_size": None,
                     "seq_len": None, "channels_last": False, "device": "cpu", "device_name": "cpu",
                     "world_size": world, "precision": precision, "status": "ok", "repeat": 0,
                     "step_time_ms_median": ms, "throughput": world * 8 / ms * 1e3, "peak_rss_bytes": 1e8})
    table = summarize(pd.DataFrame(rows)).set_index(["world_size", "precision"])
    assert table.loc[(2, "fp32"), "scaling_efficiency"] == pytest.approx(10.0 / 12.5)
    assert table.loc[(2, "amp_bf16"), "scaling_efficiency"] == pytest.approx(5.0 / 8.0)
    assert table.loc[(4, "fp32"), "throughput_scaling_efficiency"] == pytest.approx(0.5)
    assert table.loc[(1, "fp32"), "scaling_efficiency"] == 1.0
    # fp32-vs-AMP pairing stays within a world size: does AMP's speedup survive scaling?
    assert table.loc[(1, "amp_bf16"), "speedup_vs_fp32"] == pytest.approx(2.0)
    assert table.loc[(2, "amp_bf16"), "speedup_vs_fp32"] == pytest.approx(12.5 / 8.0)
    assert math.isnan(summarize(pd.DataFrame(rows[2:4])).loc[0, "scaling_efficiency"])  # no baseline


def test_amp_bench_run_under_an_outer_torchrun_is_refused(write_suite, monkeypatch, capsys):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert cli_main(["run", str(write_suite(DDP_SUITE))]) == 2
    err = capsys.readouterr().err
    assert "running under torchrun" in err and "nproc_per_node" in err and "Traceback" not in err


# --------------------------------------------------------------------------- real torchrun runs

def _alive(marker: str) -> list[int]:
    """Processes whose command line names the run directory: the launcher and every rank."""
    return processes_with(marker)


@pytest.mark.slow
def test_two_gloo_processes_fp32_and_bf16_against_one(write_suite, tmp_path):
    results = amp_bench.run_suite(write_suite(DDP_SUITE), device="cpu", results_dir=tmp_path / "results")
    assert list(results["status"]) == ["ok"] * 4, results[["case_id", "reason"]]
    assert sorted(results["world_size"]) == [1, 1, 2, 2]
    assert set(results["dist_backend"]) == {"gloo"} and set(results["nnodes"]) == {1}
    assert set(results["scaling"]) == {"weak: per-process batch fixed"}
    assert (results["num_threads"] == 1).all()
    assert set(results["worker_start"]) == {"fork"}  # the torchrun launcher too: a child of the run's fork server
    assert list(results["global_batch_size"]) == [8 * w for w in results["world_size"]]
    for row in results.itertuples():
        # global throughput: every rank's samples over the job's window
        assert row.throughput == pytest.approx(row.world_size * 8 * 8 / row.window_s)
        rank_medians = [float(x) for x in row.rank_step_time_ms_medians.split()]
        assert len(rank_medians) == row.world_size
        # the median of the per-step max over ranks is at least every rank's own median
        assert row.step_time_ms_median >= max(rank_medians) * (1 - 1e-3)
    samples = amp_bench.load_samples(results.attrs["run_dir"])
    measured = samples[samples["phase"] == "measure"].groupby("case_id")["step_time_ms"].median()
    for row in results.itertuples():
        assert measured[row.case_id] == pytest.approx(row.step_time_ms_median)
    # the same seed and the same batch on every rank: DDP averages identical gradients
    np1 = results.set_index("case_id").loc["mlp-bs8-np1-fp32", "loss_last"]
    assert results.set_index("case_id").loc["mlp-bs8-np2-fp32", "loss_last"] == pytest.approx(np1, rel=1e-4)
    table = summarize(results).set_index(["world_size", "precision"])
    for precision in ("fp32", "amp_bf16"):
        efficiency = table.loc[(2, precision), "scaling_efficiency"]
        assert efficiency == pytest.approx(table.loc[(1, precision), "step_time_ms"]
                                           / table.loc[(2, precision), "step_time_ms"])
        assert 0 < efficiency < 10
        assert table.loc[(2, precision), "throughput_scaling_efficiency"] > 0
    assert table.loc[(2, "amp_bf16"), "speedup_vs_fp32"] > 0
    print("\n" + summarize(results)[["world_size", "precision", "step_time_ms", "throughput", "speedup_vs_fp32",
                                     "scaling_efficiency", "throughput_scaling_efficiency"]].to_string())
    assert not _alive(results.attrs["run_dir"])


FAULT_SUITE = """
models:
  - {ref: "python:toy_models:rank_fails", label: killed, options: {how: sigkill}}
  - {ref: "python:toy_models:rank_fails", label: hangs, options: {how: hang}}
  - {ref: "python:toy_models:rank_fails", label: oom, options: {how: oom}}
batch_sizes: [4]
precisions: [fp32]
nproc_per_node: 2
threads_per_rank: 1
warmup_steps: 1
steps: 4
timeout_s: 15
explain: false
"""
# timeout_s covers the launcher and two ranks, forked from the run's fork server, meeting and training: the
# killed and oom cases end in under a second here (when each imported torch, they took 7-10 s, over 20 s under CI's
# load); the hang costs it once. The oom case runs last: its ranks start, meet and train three steps after a kill
# and a hang, so the run goes on.


@pytest.mark.slow
def test_a_killed_oom_or_hung_rank_ends_its_case_and_the_run_goes_on(write_suite, tmp_path):
    started = time.monotonic()
    results = amp_bench.run_suite(write_suite(FAULT_SUITE), device="cpu", results_dir=tmp_path / "results")
    elapsed = time.monotonic() - started
    rows = results.set_index("model_label")
    assert rows.loc["killed", "status"] == "oom"  # SIGKILL without a result, as the OOM killer's
    assert rows.loc["killed", "reason"].startswith("rank 1 of 2 was killed by SIGKILL")
    assert rows.loc["oom", "status"] == "oom" and rows.loc["oom", "reason"].startswith("rank 1 of 2: ")
    assert "allocate" in rows.loc["oom", "reason"]
    assert rows.loc["hangs", "status"] == "timeout" and "timeout_s=15" in rows.loc["hangs", "reason"]
    assert list(rows.index) == ["killed", "hangs", "oom"] and set(rows["world_size"]) == {2}
    assert elapsed < 15 + 3 * 60  # the hang cost its timeout, not the whole run
    run_dir = results.attrs["run_dir"]
    assert not _alive(run_dir)
    assert not list(Path(run_dir, "work").glob("*.rank*"))
    assert not [p for p in Path(run_dir, "work").iterdir() if p.is_dir()]  # torchrun's log folders: a hung case's too
    log = Path(run_dir, rows.loc["killed", "log_file"]).read_text()
    assert "Root Cause" in log
    assert "fresh interpreter" not in log  # the launcher forked its ranks


def test_forked_ranks_that_end_badly_are_all_named_in_the_summary():
    """The launcher's watch over ranks it forks: each says its rank as it starts; one killed outright and one
    that exits 1 are both named, in the lines the parent reads exit codes from, though torchrun's agent would
    name only the first it reaps."""
    import os
    import signal
    previous = signal.getsignal(signal.SIGCHLD)
    exits = torchrun.RankExits()
    try:
        pids = []
        for rank, ending in ((0, "exit"), (1, "kill"), (2, "ok")):
            pid = os.fork()
            if pid == 0:  # the child: as a forked rank starts, then its ending
                exits.started(rank)
                os.kill(os.getpid(), signal.SIGKILL) if ending == "kill" else os._exit(1 if ending == "exit" else 0)
            pids.append(pid)
        deadline = time.monotonic() + 30
        while len(exits.exits) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
            exits.peek()
        assert {rank: code for rank, (_, code) in exits.exits.items()} == {0: 1, 1: -9, 2: 0}
        assert torchrun.torchrun_exits(exits.summary()) == {0: 1, 1: -9}  # the ranks that ended badly
    finally:
        signal.signal(signal.SIGCHLD, previous)
        for pid in pids:
            os.waitpid(pid, 0)  # peeking left them to be reaped
        os.close(exits.read_fd)
        os.close(exits.write_fd)


def test_the_launcher_forks_ranks_only_where_its_imports_left_it_one_thread(tmp_path):
    """It imports what a rank imports (OpenMP held to one thread meanwhile, the suite's own setting back after);
    a model module that starts a thread as it imports keeps the ranks on fresh interpreters, with the reason."""
    import os
    import subprocess
    import sys
    (tmp_path / "plain_models.py").write_text("def mlp(**_):\n    pass\n")
    (tmp_path / "threaded_models.py").write_text(
        "import threading, time\nthreading.Thread(target=time.sleep, args=(600,), daemon=True).start()\n")
    for name in ("plain", "threaded"):
        (tmp_path / f"{name}.json").write_text(json.dumps(
            {"case": {"model": {"ref": f"python:{name}_models:mlp"}, "search_dirs": [str(tmp_path)]}}))
    check = ("import os, sys\nfrom amp_bench.launchers.torchrun import _import_what_ranks_import as check\n"
             "for name in ('plain', 'threaded', 'missing'):\n"
             "    argv = ['--standalone', '-m', 'amp_bench.worker', 'case', f'{sys.argv[1]}/{name}.json', 'r.json']\n"
             "    print(name, repr(check(argv)), os.environ['OMP_NUM_THREADS'])\n")
    proc = subprocess.run([sys.executable, "-c", check, str(tmp_path)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "OMP_NUM_THREADS": "3"})
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0 and len(lines) == 3, proc.stdout + proc.stderr
    assert lines[0] == "plain '' 3"
    assert "the torchrun launcher runs 2 threads after its imports" in lines[1] and lines[1].endswith(" 3")
    assert "no case spec to read (FileNotFoundError)" in lines[2]


def test_no_process_carries_an_unknown_token():
    assert processes_with_token("no-such-token") == []


def test_more_processes_than_gpus_or_nccl_on_the_cpu_is_unsupported(write_suite, monkeypatch):
    import torch

    from amp_bench.measure.step import UnsupportedCase
    from amp_bench.platform.device import DeviceInfo
    case = load_suite(write_suite(DDP_SUITE)).cases("cuda")[2]  # np2
    rank = ddp.Rank(rank=0, local_rank=0, world_size=2, local_world_size=2, nnodes=1)
    gpu = DeviceInfo(type="cuda", name="Fake GPU", index=0, capability=(9, 0))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(UnsupportedCase, match="nproc_per_node=2 from cuda:0 needs 2 GPUs on this node, 1 visible"):
        rank.check(case, gpu, "nccl")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    rank.check(case, gpu, "nccl")
    assert rank.backend(case, "cuda") == "nccl" and rank.backend(case, "cpu") == "gloo"
    with pytest.raises(UnsupportedCase, match="nccl needs CUDA GPUs"):
        rank.check(case, DeviceInfo(type="cpu", name="cpu"), "nccl")


def test_a_rank_knows_its_place_only_under_our_launcher(monkeypatch):
    for key, value in {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
                       "GROUP_WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AMP_BENCH_DDP", raising=False)
    assert ddp.Rank.from_env() is None  # someone else's torchrun job
    monkeypatch.setenv("AMP_BENCH_DDP", "1")
    assert ddp.Rank.from_env() == ddp.Rank(1, 1, 4, 2, 2)
