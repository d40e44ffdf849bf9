"""Whole runs in real worker processes: every status, the run going on, interruption, the columns."""
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

import amp_bench
from amp_bench.store.results import RESULT_COLUMNS, SAMPLE_COLUMNS
from amp_bench.studies.run_plan import schedule
from amp_bench.suite import load_suite
from conftest import ROOT, processes_with

pytestmark = pytest.mark.slow

STATUS_SUITE = """
models:
  - python:toy_models:mlp
  - python:toy_models:raises
  - python:toy_models:huge_alloc
  - {ref: "python:toy_models:sleeps", options: {seconds: 120}}
  - python:toy_models:nan_loss
  - python:toy_models:dies
batch_sizes: [4]
precisions: [fp32, tf32]
warmup_steps: 1
steps: 3
explain: false
timeout_s: 10  # the sleeper times out; every other case, forked, ends in about 0.1 s (100x, for a busy machine)
"""


def _workers_alive(marker: str) -> list[int]:
    """Workers whose command line names the marker: a spawned worker's names its run directory; a run's
    fork server (amp_bench.launchers.forkserver) and the children it forks carry the suite's folder."""
    return processes_with("amp_bench.worker", marker) + processes_with("amp_bench.launchers.forkserver", marker)


def test_every_status_is_recorded_and_the_run_goes_on(write_suite, tmp_path, own_fork_server):
    results = amp_bench.run_suite(write_suite(STATUS_SUITE), device="cpu", results_dir=tmp_path / "results")
    status = {(r.model_label, r.precision): r for r in results.itertuples()}
    assert status["mlp", "fp32"].status == "ok"
    assert status["raises", "fp32"].status == "error"
    assert "ValueError: this model is broken on purpose" in status["raises", "fp32"].reason
    assert status["huge_alloc", "fp32"].status == "oom"
    assert status["sleeps", "fp32"].status == "timeout"
    assert status["nan_loss", "fp32"].status == "nonfinite"
    assert status["dies", "fp32"].status == "error" and "exited with code 3" in status["dies", "fp32"].reason
    for model in ("mlp", "raises", "huge_alloc", "sleeps", "nan_loss", "dies"):
        row = status[model, "tf32"]
        assert row.status == "unsupported" and "TF32" in row.reason
    run_dir = Path(results.attrs["run_dir"])
    assert "Traceback" in (run_dir / status["raises", "fp32"].log_file).read_text()
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["cases_finished"] == 12
    assert not _workers_alive(str(tmp_path))  # the run's fork server stopped with it
    # the ok row is complete and sane
    ok = status["mlp", "fp32"]
    assert ok.step_time_ms_p10 <= ok.step_time_ms_median <= ok.step_time_ms_p90
    assert ok.throughput > 0 and ok.peak_rss_bytes > 50e6 and ok.output_dtype == "float32"
    assert not ok.tf32_matmul and not ok.tf32_cudnn


def test_result_columns_and_samples(write_suite, tmp_path):
    suite = write_suite(STATUS_SUITE.replace("timeout_s: 10", "timeout_s: 60").replace(
        "  - python:toy_models:raises\n  - python:toy_models:huge_alloc\n"
        '  - {ref: "python:toy_models:sleeps", options: {seconds: 120}}\n'
        "  - python:toy_models:nan_loss\n  - python:toy_models:dies\n", "")
        .replace("[fp32, tf32]", "[fp32, amp_bf16]\nallow_emulated: true"))  # bf16 on every CPU
    results = amp_bench.run_suite(suite, device="cpu", results_dir=tmp_path, repeats=2, peak_tflops=0.5)
    run_dir = Path(results.attrs["run_dir"])
    table = amp_bench.load_results(run_dir)
    assert list(table.columns[: len(RESULT_COLUMNS)]) == RESULT_COLUMNS
    assert len(table) == 4 and set(table.status) == {"ok"}
    assert list(table.precision) == ["fp32", "amp_bf16", "amp_bf16", "fp32"]  # interleaved, rotated
    assert list(table.repeat) == [0, 0, 1, 1]
    # telemetry and provenance on every row
    assert table.fingerprint.notna().all() and table.fingerprint.nunique() == 1
    assert (table.cpu_bf16_isa.notna()).all() and table.cpu_count.notna().all()
    assert (table.flops_per_step > 0).all() and (table.peak_tflops == 0.5).all()
    assert ((table.mfu > 0) & (table.mfu < 1)).all() and set(table.peak_tflops_source) == {"given by the user"}
    assert table.peak_rss_lifetime_bytes.ge(table.peak_rss_bytes).all()
    assert table.nvml_mem_used_peak_bytes.isna().all()  # no GPU: empty, not zero
    bf16 = table[table.precision == "amp_bf16"].iloc[0]
    assert bf16.output_dtype == "bfloat16" and pd.isna(bf16.scaler_skipped_steps)
    samples = amp_bench.load_samples(run_dir)
    assert list(samples.columns) == SAMPLE_COLUMNS
    assert len(samples) == 4 * (1 + 3)
    measured = samples[samples.phase == "measure"]
    assert measured.step_time_ms.notna().all() and len(measured) == 12
    first = table.iloc[0]
    steps = measured[(measured.case_id == first.case_id) & (measured.repeat == 0)].step_time_ms
    assert steps.median() == pytest.approx(first.step_time_ms_median)
    assert amp_bench.load_results(tmp_path).shape[0] == 4  # a tree of runs loads too


def test_scaler_skips_inside_the_timed_window_are_counted(write_suite, tmp_path):
    suite = write_suite("""
models: [{ref: "python:toy_models:inf_grad", options: {at_steps: [1, 3]}}]
batch_sizes: [8]
precisions: [amp_fp16]
allow_emulated: true
warmup_steps: 2
steps: 4
explain: false
""")
    row = amp_bench.run_suite(suite, device="cpu", results_dir=tmp_path).iloc[0]
    assert row.status == "ok", row.reason
    assert row.scaler_skipped_warmup_steps == 1 and row.scaler_skipped_steps == 1
    assert row.scaler_final_scale == 2.0**14
    assert "GradScaler skipped 1 of 4" in row.warnings


def test_deadline_covers_process_exit_and_grandchildren_are_cleaned_up(write_suite, tmp_path):
    suite = write_suite("""
models: [python:toy_models:leaves_thread, python:toy_models:forks_child]
batch_sizes: [4]
precisions: [fp32]
warmup_steps: 1
steps: 2
timeout_s: 20
explain: false
""")
    started = time.monotonic()
    results = amp_bench.run_suite(suite, device="cpu", results_dir=tmp_path, isolation="spawn")
    assert time.monotonic() - started < 90
    by = results.set_index("model_label")
    # a worker ends once its result is written and its output flushed (ending.exit_without_teardown),
    # fresh interpreter or forked: a thread the model left running is not waited for
    assert by.loc["leaves_thread", "status"] == "ok" and by.loc["leaves_thread", "worker_start"] == "spawn"
    assert "hung after" not in str(by.loc["leaves_thread", "warnings"])
    assert by.loc["leaves_thread", "worker_seconds"] < 20
    forked = amp_bench.run_suite(suite, device="cpu", results_dir=tmp_path / "forked").set_index("model_label")
    assert forked.loc["leaves_thread", "status"] == "ok" and forked.loc["leaves_thread", "worker_start"] == "fork"
    assert "hung after" not in str(forked.loc["leaves_thread", "warnings"])
    # a grandchild holding nothing back: the case finishes promptly and the grandchild is killed
    assert by.loc["forks_child", "status"] == "ok" and by.loc["forks_child", "worker_seconds"] < 20
    time.sleep(0.5)
    leftovers = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _cmdline(p).startswith(
        f"{sys.executable} -c import time; time.sleep(3600)")]
    assert not leftovers


def test_a_worker_that_hangs_after_its_result_keeps_it_with_a_warning(tmp_path):
    """A process that still hangs once its result is written (a DDP rank's teardown waiting on a
    peer; here an interpreter waiting for a thread at exit) is killed at the deadline, and its
    measurement is kept with the reason: the deadline covers the process's exit, not its pipe."""
    from amp_bench.launchers.process import run_worker
    writes_then_hangs = ("import json, sys, threading, time; json.dump({'status': 'ok'}, open(sys.argv[2], 'w')); "
                         "threading.Thread(target=time.sleep, args=(3600,)).start()")
    result = tmp_path / "result.json"
    started = time.monotonic()
    found = run_worker([str(result)], result, tmp_path / "worker.log", timeout_s=3,
                       launcher=[sys.executable, "-c", writes_then_hangs, "job"])
    assert 3 <= time.monotonic() - started < 15
    assert found.result["status"] == "ok" and not found.timed_out
    assert "worker hung after writing its result and was killed at timeout_s=3" in found.result["warnings"]


def _cmdline(proc_dir: Path) -> str:
    try:
        return (proc_dir / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def test_failed_instrumentation_keeps_the_measurement(write_suite, tmp_path):
    suite = write_suite("models: [python:toy_models:fails_under_flop_counter]\nbatch_sizes: [4]\n"
                        "precisions: [fp32]\nwarmup_steps: 1\nsteps: 3\nexplain: false\n")
    row = amp_bench.run_suite(suite, device="cpu", results_dir=tmp_path).iloc[0]
    assert row.status == "ok" and row.step_time_ms_median > 0
    assert "FLOP/phase instrumentation failed: RuntimeError: unsupported under the FLOP counter" in row.warnings
    assert pd.isna(row.flops_per_step)


def test_schedule_interleaves_precisions_across_repeats(write_suite):
    suite = load_suite(write_suite("models: [python:toy_models:mlp]\nbatch_sizes: [1, 2]\n"
                                   "precisions: [fp32, amp_bf16]\nrepeats: 2\n"))
    order = [(c.batch_size, c.precision, r) for c, r in schedule(suite.cases("cpu"))]
    assert order == [(1, "fp32", 0), (1, "amp_bf16", 0), (1, "amp_bf16", 1), (1, "fp32", 1),
                     (2, "fp32", 0), (2, "amp_bf16", 0), (2, "amp_bf16", 1), (2, "fp32", 1)]


INTERRUPT_SUITE = """
models:
  - python:toy_models:mlp
  - {ref: "python:toy_models:sleeps", options: {seconds: 300}}
batch_sizes: [4]
precisions: [fp32]
warmup_steps: 1
steps: 2
timeout_s: 600
explain: false
"""


def _sigint_as_from_a_terminal() -> None:
    """SIGINT at its default, as a user's shell leaves it. A process started with SIGINT ignored
    (a pytest-xdist worker's children, a background job in a script) keeps ignoring it: Python then
    installs no KeyboardInterrupt handler, rightly, and the run would not notice the signal."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_an_interrupted_run_keeps_finished_cases(write_suite, tmp_path, sig, own_fork_server):
    results_dir = tmp_path / "results"
    proc = subprocess.Popen([sys.executable, "-m", "amp_bench", "run", str(write_suite(INTERRUPT_SUITE)),
                             "--device", "cpu", "--results-dir", str(results_dir)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=_sigint_as_from_a_terminal)
    deadline = time.monotonic() + 120
    table = None
    while time.monotonic() < deadline:
        files = list(results_dir.glob("*/results.csv"))
        if files and len(pd.read_csv(files[0])) == 1 and _workers_alive(str(tmp_path)):
            table = files[0]
            break
        time.sleep(0.2)
    assert table is not None, "the first case never finished"
    run_dir = table.parent
    proc.send_signal(sig)
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == (-9 if sig == signal.SIGKILL else 130), output
    kept = amp_bench.load_results(run_dir)
    assert list(kept.model_label) == ["mlp"] and kept.status.iloc[0] == "ok"
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == ("running" if sig == signal.SIGKILL else "interrupted")
    assert not [p for p in run_dir.rglob("*") if ".tmp" in p.name]
    time.sleep(0.5)  # the kernel delivers the parent-death signal asynchronously
    assert not _workers_alive(str(tmp_path))  # the fork server and its child too
    if sig != signal.SIGKILL:
        assert "interrupted" in output and "Traceback" not in output
