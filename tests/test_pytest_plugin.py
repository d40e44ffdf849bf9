"""The pytest-benchmark integration: the amp_benchmark fixture saves, compare-fail gates, ingest
round-trips the JSON."""
import json
import subprocess
import sys

import pytest

import amp_bench
from amp_bench.errors import UserError
from amp_bench.store.ingest import ingest
from conftest import FIXTURES

pytestmark = pytest.mark.slow

SUITE = """
models: [{{ref: "python:toy_models:clocked", label: sleepy, options: {{ms: {ms}, jitter: 0.0}}}},
         {{ref: "python:toy_models:clocked", label: drowsy, options: {{ms: {bf16_ms}, jitter: 0.0}}}}]
batch_sizes: [4]
precisions: [fp32, amp_bf16]
allow_emulated: true  # bf16 runs on every CPU (emulated where it has no bf16 ISA)
warmup_steps: 2
steps: 8
explain: false
"""

TEST_FILE = """
def test_sleepy_fp32(amp_benchmark):
    extra = amp_benchmark("suite.yaml", "sleepy-bs4-fp32", device="cpu")
    assert extra["output_dtype"] == "float32"
    assert extra["cpu_allocator"] in ("keep", "system (not glibc)")  # the worker's default, here too

def test_drowsy_bf16(amp_benchmark):
    extra = amp_benchmark("suite.yaml", "drowsy-bs4-amp_bf16", device="cpu")
    assert extra["output_dtype"] == "bfloat16"
"""


def bench_session(workdir, ms, bf16_ms, *args):
    (workdir / "suite.yaml").write_text(SUITE.format(ms=ms, bf16_ms=bf16_ms))
    # the model advances amp_bench's host clock by `ms` a step and pytest-benchmark reads that clock:
    # the gate below is tested on exact step times, whatever else the machine is doing
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_amp.py",
                           "--benchmark-timer=amp_bench.measure.window.host_clock",
                           f"--benchmark-storage=file://{workdir / 'storage'}", *args],
                          cwd=workdir, capture_output=True, text=True, timeout=300, env=_own_session_env())


def _own_session_env() -> dict:
    """This environment without pytest-xdist's worker variables: pytest-benchmark turns itself off
    in an xdist worker, and the inner session is a plain one."""
    import os
    return {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST", "PYTEST_CURRENT_TEST"))}


@pytest.fixture
def workdir(tmp_path):
    (tmp_path / "toy_models.py").write_text((FIXTURES / "toy_models.py").read_text())
    (tmp_path / "test_amp.py").write_text(TEST_FILE)
    (tmp_path / "conftest.py").write_text("")
    return tmp_path


def test_fixture_saves_and_compare_fail_gates(workdir):
    first = bench_session(workdir, 10, 10, "--benchmark-autosave", "--benchmark-save-data")
    assert first.returncode == 0, first.stdout + first.stderr
    saved = sorted((workdir / "storage").rglob("*.json"))
    assert len(saved) == 1
    data = json.loads(saved[0].read_text())
    assert data["machine_info"]["amp_bench"]["device"]["type"] == "cpu"
    bench = {b["name"]: b for b in data["benchmarks"]}["test_sleepy_fp32"]
    assert bench["stats"]["rounds"] == 8 and bench["extra_info"]["case_id"] == "sleepy-bs4-fp32"
    assert bench["stats"]["median"] == pytest.approx(0.010)  # exactly the injected 10 ms
    assert len(bench["extra_info"]["step_times_ms"]) == 8
    assert min(bench["extra_info"]["step_times_ms"]) == pytest.approx(10)
    # one comparing session: the fp32 case as fast as saved passes the gate, the bf16 one 3x slower fails it
    compared = bench_session(workdir, 10, 30, "--benchmark-compare", "--benchmark-compare-fail=median:50%")
    output = compared.stdout + compared.stderr
    assert compared.returncode != 0 and "Performance has regressed" in output, output
    regressed = [line for line in output.splitlines() if line.startswith("\t") and "median" in line]
    assert len(regressed) == 1 and "test_drowsy_bf16" in regressed[0], output

    # ingest round-trips the saved JSON into a results directory
    run_dir = ingest(saved[0], workdir / "results")
    table = amp_bench.load_results(run_dir).set_index("case_id")
    row = table.loc["sleepy-bs4-fp32"]
    assert row.step_time_ms_median == pytest.approx(bench["stats"]["median"] * 1e3)
    assert row.precision == "fp32" and row.batch_size == 4 and row.status == "ok"
    samples = amp_bench.load_samples(run_dir)
    assert len(samples[samples.case_id == "sleepy-bs4-fp32"]) == 8


def test_ingest_rejects_what_is_not_pytest_benchmark_json(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text('{"hello": 1}')
    with pytest.raises(UserError, match="benchmarks: expected a non-empty list"):
        ingest(bad, tmp_path)
    with pytest.raises(UserError, match="no such file"):
        ingest(tmp_path / "missing.json", tmp_path)
