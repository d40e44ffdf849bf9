import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# The tests run several processes on two cores, and each starts workers whose torch runs one OpenMP thread
# a core. By default an OpenMP thread that waits spins, on the core the other process needs: two smoke
# runs side by side took 75 s each, and 26 s each with waiting threads asleep. Measured figures in the
# tests never depend on the machine's speed, so they sleep here; a user's run keeps torch's default.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# Three test processes share two cores: a run's contention watch would stop most cases as `contended`.
# Here cases run to the end and their rows say so (on_contention: flag); the tests of the early stop
# set it back to stop. A user's run stops starved cases early by default.
os.environ.setdefault("AMP_BENCH_ON_CONTENTION", "flag")

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"
sys.path.insert(0, str(FIXTURES))


def processes_with(*markers: str) -> list[int]:
    """Live processes whose command line contains every marker (e.g. a run directory)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if all(m in cmdline for m in markers):
                pids.append(int(entry.name))
    return pids


def native_on_this_cpu(precision: str) -> bool:
    """Does this CPU run the mode natively (so a default suite runs it), or only emulated (so the
    gate leaves it out)? Tests that see a default run's rows hold on both kinds of CPU."""
    from amp_bench.platform.device import precision_support, probe_device
    return precision_support(precision, probe_device("cpu")).supported


# Seconds each of the longest test files took on the 2-core EPYC (the sum of its tests' setup, call and
# teardown times in one run of the test command, three xdist processes, bf16 instructions hidden,
# 2026-12-07). loadfile hands a process one file at a time as it runs dry; handed out longest first, the
# short files fill the end. xdist itself would order the files by how many tests they hold (its
# --loadscope-reorder, on by default), which put test_slurm and test_pytest_plugin last and left one
# process running alone for 45 s of a 315 s part: pytest_configure turns that off. A file not listed keeps
# its place after these; a stale figure costs only some of that.
LONG_FILES = {"test_gpu_check.py": 86, "test_forkserver.py": 46, "test_runner.py": 43, "test_cluster.py": 37,
              "test_distributed.py": 32, "test_slurm.py": 29, "test_compile.py": 27, "test_predict.py": 24,
              "test_compare.py": 23, "test_report_browser.py": 21, "test_cli_e2e.py": 21, "test_explain_cli.py": 20,
              "test_nightly.py": 19, "test_pytest_plugin.py": 19, "test_gpu_advice.py": 16, "test_headroom.py": 16,
              "test_structure.py": 15, "test_fidelity.py": 14, "test_disturbed_pairs.py": 13, "test_phases.py": 13,
              "test_history.py": 11, "test_gpu_predictions.py": 10, "test_advice_try.py": 9}


def pytest_configure(config):
    """One shared fork server (a zygote, amp_bench/launchers/forkserver.py) for this test command: its
    runs join it instead of each importing torch, torch._dynamo and the model libraries again (~3.5 s
    of CPU a run, some 50 runs). Started once, in the process that starts the xdist ones (they, and
    the CLI runs the tests start, inherit AMP_BENCH_FORK_ZYGOTE). A run whose import-time variables
    differ (a test that hides the bf16 instructions) starts its own server; tests of a run's own
    server's lifecycle leave the zygote (the `own_fork_server` fixture)."""
    from amp_bench.launchers.forkserver import ZYGOTE_ENV, start_zygote
    from amp_bench.suite.model_refs import preload_modules
    if hasattr(config.option, "loadscopereorder"):  # xdist: hand files out in LONG_FILES' order
        config.option.loadscopereorder = False
    if hasattr(config, "workerinput") or os.environ.get(ZYGOTE_ENV) is not None or not hasattr(os, "fork"):
        return
    import tempfile
    folder = Path(tempfile.mkdtemp(prefix="amp-bench-zygote-"))  # short: a socket's path has at most 107 bytes
    zygote = start_zygote(folder / "zygote.sock", preload_modules(["torchvision/resnet18", "transformers/gpt2"]),
                          log_path=folder / "zygote.log")
    config.amp_bench_zygote = (zygote, folder)
    if zygote.poll() is not None or not (folder / "zygote.sock").exists():
        log = (folder / "zygote.log").read_text(errors="replace")[-2000:] if (folder / "zygote.log").exists() else ""
        print(f"the tests' fork zygote did not start (every run starts its own server):\n{log}", file=sys.stderr)
        return
    os.environ[ZYGOTE_ENV] = str(folder / "zygote.sock")


def pytest_unconfigure(config):
    zygote, folder = getattr(config, "amp_bench_zygote", (None, None))
    if zygote is not None:
        import shutil
        zygote.kill()
        zygote.wait()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def own_fork_server(monkeypatch):
    """Runs in this test start a fork server of their own (the run's lifecycle is what it checks)."""
    from amp_bench.launchers.forkserver import ZYGOTE_ENV
    monkeypatch.delenv(ZYGOTE_ENV, raising=False)


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: -LONG_FILES.get(item.path.name, 0))  # stable: a file's tests keep their order
    import torch
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run `pytest -m gpu` on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _session_folder(tmp_path_factory, name: str, variable: str):
    """A folder shared by every xdist process of this test command, named in `variable` while it runs."""
    session = os.environ.get("PYTEST_XDIST_TESTRUNUID")  # one id for every xdist process of this command
    base = tmp_path_factory.getbasetemp()
    folder = base.parent / f"{name}-{session}" if session else base / name
    folder.mkdir(parents=True, exist_ok=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(variable, str(folder))
        yield folder


@pytest.fixture(scope="session", autouse=True)
def probe_cache(tmp_path_factory):
    """Runs of this session reuse one CPU probe per environment (amp_bench/studies/probe_cache.py):
    some 45 runs would each start a worker that imports torch only to describe this CPU. The CLI
    runs the tests start inherit it. Tests of the probe itself unset it."""
    yield from _session_folder(tmp_path_factory, "probe-cache", "AMP_BENCH_PROBE_CACHE")


@pytest.fixture(scope="session", autouse=True)
def inventory_cache(tmp_path_factory):
    """Steps recorded on fake tensors for predictions (amp_bench/store/inventories.py) are kept for this test
    command, shared by its xdist processes (each file is written under a temporary name and renamed), and
    never in the user's cache."""
    yield from _session_folder(tmp_path_factory, "inventory-cache", "AMP_BENCH_CACHE")


def amp_bench_cli(*args, env: dict[str, str] | None = None):
    """`python -m amp_bench ARGS` from the repository root, run in this process: what a subprocess would
    return (exit code, stdout, stderr), without a second interpreter's imports (pandas and scipy, ~1.7 s of
    CPU a call). For any command whose test does not check the process itself (a run's workers are forked from
    the zygote as a command's are); tests of the command as a process (its exit through `python -m`, a killed
    run) start one (tests/test_cli_e2e.py)."""
    import contextlib
    import io
    import subprocess

    from amp_bench.cli import main
    argv = [str(a) for a in args]
    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        patch.chdir(ROOT)
        for key, value in (env or {}).items():
            patch.setenv(key, value)
        code = main(argv)
    return subprocess.CompletedProcess(["amp_bench", *argv], code, out.getvalue(), err.getvalue())


@pytest.fixture
def write_suite(tmp_path):
    """Write a suite file next to the toy models and return its path."""
    def write(text: str, name: str = "suite.yaml") -> Path:
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        (tmp_path / "toy_models.py").write_text((FIXTURES / "toy_models.py").read_text(), encoding="utf-8")
        return path
    return write


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory):
    """One real CPU run of suites/smoke.yaml through the CLI (two of its 24 repeats: paired speedups
    with an interval; 8 steps a case instead of its quarter-second windows: what the tests read is there
    either way), shared by the tests
    that read it. Shared across the xdist processes too: the
    first that needs it runs it under a file lock, the others wait and read what it left (each
    process running its own took 120-180 s of the test command's two cores)."""
    import json
    import subprocess

    from filelock import FileLock
    session = os.environ.get("PYTEST_XDIST_TESTRUNUID")  # one id for every process of this test command
    base = tmp_path_factory.getbasetemp()
    out = base.parent / f"smoke-{session}" if session else base / "smoke"
    command = [sys.executable, "-m", "amp_bench", "run", "suites/smoke.yaml", "--device", "cpu", "--repeats", "2",
               "--steps", "8",
               "--cpu-allocator", "system",  # glibc's defaults, through the CLI to the forked workers
               "--results-dir", str(out / "results"), "--reports-dir", str(out / "reports")]
    with FileLock(str(out) + ".lock"):
        if not (out / "proc.json").exists():
            proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600,
                                  env={**os.environ, "COLUMNS": "160"})
            out.mkdir(parents=True, exist_ok=True)
            (out / "proc.json").write_text(json.dumps([proc.returncode, proc.stdout, proc.stderr]))
        returncode, stdout, stderr = json.loads((out / "proc.json").read_text())
    return subprocess.CompletedProcess(command, returncode, stdout, stderr), out
