"""The fork server (amp_bench/launchers/forkserver.py): each case a fresh child of one process that imported
torch once; the server never touches CUDA or starts threads; children are apart from each other; a child
that crashes or hangs costs its own row only; where the server cannot be used, workers spawn as before."""
import os
import sys
import types
from pathlib import Path

import pytest

import amp_bench
from amp_bench.launchers import forkserver, process
from amp_bench.launchers.forkserver import ForkServer, launch
from amp_bench.platform.forking import unsafe_to_fork
from amp_bench.suite.model_refs import preload_modules


def test_a_server_that_could_not_fork_safely_says_why():
    """The checks the server runs on itself after its imports (here on stand-ins for what they read)."""
    initialised = types.SimpleNamespace(cuda=types.SimpleNamespace(is_initialized=lambda: True))
    saved = sys.modules.get("torch")
    sys.modules["torch"] = initialised
    try:
        assert unsafe_to_fork() == "an import initialised CUDA in the fork server"
        assert unsafe_to_fork("the lockstep conductor", count_threads=False) == \
            "an import initialised CUDA in the lockstep conductor"
    finally:
        sys.modules["torch"] = saved
    own_env = {"TORCHINDUCTOR_CACHE_DIR": "/x", "AMP_BENCH_EXPLAIN_TRACE": "/t"}  # read when used: it forks
    assert forkserver.forked_program(None, ["case"], own_env) == ("amp_bench.worker", ["case"])
    assert forkserver.forked_program(None, [], {"OMP_NUM_THREADS": "1"}) is None  # read as torch loads: it spawns
    assert forkserver.forked_program(None, [], {"CUDA_VISIBLE_DEVICES": "1"}) is None


def test_the_server_runs_the_worker_or_the_torchrun_launcher_and_nothing_else():
    """A DDP case's torchrun launcher is a child too (its ranks set the thread count they are given); any other
    launcher, or another interpreter, starts fresh."""
    from amp_bench.launchers import torchrun
    case = types.SimpleNamespace(nproc_per_node=2, nnodes=1)
    launcher = torchrun.launch_command(case, "x", "logs")
    module, argv = forkserver.forked_program(launcher, ["case", "spec.json", "result.json"])
    assert module == "amp_bench.launchers.torchrun" and argv[0] == "launch"
    assert argv[-5:] == ["-m", "amp_bench.worker", "case", "spec.json", "result.json"]
    assert forkserver.forked_program(None, ["probe"]) == ("amp_bench.worker", ["probe"])
    assert forkserver.forked_program(["/other/python", *launcher[1:]], []) is None
    assert forkserver.forked_program([sys.executable, "-m", "some.launcher"], []) is None
    assert forkserver.forked_program(launcher, [], {"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"})
    assert forkserver.forked_program(launcher, [], {"ONEDNN_MAX_CPU_ISA": "AVX2"}) is None


def test_preloads_name_what_a_worker_imports_without_importing_it():
    names = preload_modules(["torchvision/resnet18", "transformers/gpt2", "python:toy_models:mlp"])
    assert names[:2] == ["torch", "torch._dynamo"]
    assert {"torchvision.models", "transformers.models.gpt2.modeling_gpt2", "toy_models"} <= set(names)
    assert "amp_bench.measure.case" in names


@pytest.mark.slow
def test_the_server_imports_without_touching_cuda_or_starting_threads_and_forks_probes(tmp_path, own_fork_server):
    """After torch, torchvision and transformers are imported, the server checked itself: no CUDA
    initialised, no CUDA driver mapped, one thread (checked in the server); then each probe is a child."""
    server = ForkServer.start(preload_modules(["torchvision/resnet18", "transformers/gpt2"]))
    try:
        assert server.ready(), server.unusable
        assert server.ready_info["unsafe"] == "" and not server.ready_info["failed"]
        assert "transformers.models.gpt2.modeling_gpt2" in server.ready_info["imported"]
        for n in range(2):
            result = tmp_path / f"probe{n}.json"
            outcome = launch(["probe", "cpu", str(result)], result, tmp_path / "probe.log", 60, server=server)
            assert outcome.started_by == "fork" and outcome.exit_code == 0 and outcome.result["device"]["type"] == "cpu"
    finally:
        server.close()
    assert server.proc.poll() is not None  # closing the socket ended it


@pytest.mark.slow
def test_a_module_that_starts_a_thread_as_it_imports_keeps_the_run_on_fresh_interpreters(tmp_path):
    (tmp_path / "threaded_models.py").write_text(
        "import threading, time\nthreading.Thread(target=time.sleep, args=(600,), daemon=True).start()\n")
    server = ForkServer.start(["torch", "threaded_models"], search_dirs=(str(tmp_path),))
    try:
        assert not server.ready()
        assert "runs 2 threads after its imports" in server.unusable
        result = tmp_path / "probe.json"
        outcome = launch(["probe", "cpu", str(result)], result, tmp_path / "probe.log", 120, server=server)
        assert outcome.started_by == "spawn" and outcome.result["device"]["type"] == "cpu"
    finally:
        server.close()


@pytest.mark.slow
def test_children_are_apart_and_one_that_dies_or_hangs_costs_only_its_row(write_suite, tmp_path):
    """A case holding 256 MiB first, then a small one: the small child's peak RSS does not carry the
    first's (each child is reaped apart, and its high-water mark starts at the server's pages). A child that exits
    outright, and one cut at its deadline, leave the server forking the next."""
    suite = write_suite("""
models:
  - {ref: "python:toy_models:ballast", label: ballast}
  - {ref: "python:toy_models:dies", label: dies}
  - {ref: "python:toy_models:sleeps", label: hangs, options: {seconds: 600}}
  - {ref: "python:toy_models:mlp", label: small}
batch_sizes: [4]
precisions: [fp32]
warmup_steps: 1
steps: 3
timeout_s: 8
explain: false
""")
    results = amp_bench.run_suite(suite, device="cpu", results_dir=tmp_path / "results")
    rows = results.set_index("model_label")
    assert list(rows["status"]) == ["ok", "error", "timeout", "ok"], rows[["status", "reason"]]
    assert set(rows["worker_start"]) == {"fork"}
    assert rows.loc["small", "cpu_allocator"] == "keep"  # the default, set in the forked child
    assert rows.loc["small", "settle_steps"] == 1 and rows.loc["small", "settle_faulted_bytes"] >= 0
    assert rows.loc["small", "window_faulted_bytes_per_step"] >= 0
    assert "code 3" in rows.loc["dies", "reason"]
    mib = 2**20
    # the training steps' high-water mark (VmHWM): the small child does not carry the ballast's 256 MiB
    assert rows.loc["ballast", "peak_rss_bytes"] - rows.loc["small", "peak_rss_bytes"] > 200 * mib
    assert rows.loc["small", "worker_start_s"] < 5  # launch to first step: no imports left to pay
    small = write_suite("models: [{ref: 'python:toy_models:mlp', label: small}]\nbatch_sizes: [4]\n"
                        "precisions: [fp32]\nwarmup_steps: 1\nsteps: 3\nexplain: false\n", name="small.yaml")
    spawned = amp_bench.run_suite(small, device="cpu", results_dir=tmp_path / "spawned", isolation="spawn")
    assert list(spawned["worker_start"]) == ["spawn"] and list(spawned["status"]) == ["ok"]


# ----------------------------------------------------------------------------- a shared server (zygote)

def _descendants(pid: int) -> list[int]:
    """Every live process below `pid` (from /proc's parent links)."""
    parents = {}
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            parents[int(entry.name)] = int(fields[1])  # ppid; a zombie still counts until reaped
        except (OSError, ValueError, IndexError):
            continue
    found, frontier = [], [pid]
    while frontier:
        children = [child for child, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


@pytest.fixture
def zygote(tmp_path):
    """A zygote of this test's own (a test of its lifecycle must not share the session's), preloading
    nothing: each run's server imports what it asks for. Its socket in a short folder (a Unix socket's
    path has at most 107 bytes)."""
    import shutil
    import tempfile
    path = Path(tempfile.mkdtemp(prefix="zygote-")) / "z.sock"
    proc = forkserver.start_zygote(path, [], log_path=tmp_path / "zygote.log")
    assert path.exists() and proc.poll() is None, (tmp_path / "zygote.log").read_text()  # listening
    yield proc, str(path)
    proc.kill()
    proc.wait()
    shutil.rmtree(path.parent, ignore_errors=True)


@pytest.mark.slow
def test_runs_join_a_zygote_and_each_gets_a_server_of_its_own(zygote, tmp_path):
    """Two runs at once: each joins (no process of its own, no imports left once the zygote has them),
    and forks its cases through its own server; one run ending leaves the other's serving."""
    proc, path = zygote
    first, second = ForkServer.join(path, ["torch"]), ForkServer.join(path, ["torch", "amp_bench.measure.case"])
    assert first is not None and second is not None
    try:
        for server in (first, second):
            assert server.proc is None and server.ready(), server.unusable
            assert server.ready_info["zygote"] and server.ready_info["unsafe"] == ""
        outcomes = []
        for n, server in enumerate((first, second, first)):
            if n == 2:
                second.close()
            result = tmp_path / f"probe{n}.json"
            outcomes.append(launch(["probe", "cpu", str(result)], result, tmp_path / f"p{n}.log", 60, server=server))
        assert all(o.started_by == "fork" and o.exit_code == 0 and o.result["device"]["type"] == "cpu"
                   for o in outcomes), outcomes
    finally:
        first.close()
        second.close()
    assert proc.poll() is None  # the zygote serves on


def test_a_run_the_zygote_would_start_differently_starts_its_own(zygote, monkeypatch, tmp_path):
    """Import-time variables are kept by a fork: a run that hides the bf16 instructions cannot join a
    zygote that imported without; neither can a run that finds nothing listening."""
    _, path = zygote
    joined = ForkServer.join(path, [])  # the same environment: joined (so the Nones below are refusals)
    assert joined is not None and joined.ready_info["zygote"]
    joined.close()
    isa = os.environ.get("ONEDNN_MAX_CPU_ISA")
    with monkeypatch.context() as patch:  # a cap other than the zygote's (none, or AVX2 on a test run under AVX2)
        patch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2" if isa != "AVX2" else "AVX512_CORE")
        assert ForkServer.join(path, []) is None
    monkeypatch.setenv("TORCH_LOGS", "dynamo")  # read once as torch imports, like the ISA cap
    assert ForkServer.join(path, []) is None
    monkeypatch.delenv("TORCH_LOGS")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/elsewhere")  # what importing inductor sets: joined
    for key, value in (("KMP_DUPLICATE_LIB_OK", "True"), ("KMP_INIT_AT_FORK", "FALSE")):
        monkeypatch.setenv(key, value)  # what importing scikit-learn sets (the fidelity data): joined
    again = ForkServer.join(path, [])
    assert again is not None
    again.close()
    monkeypatch.setenv("KMP_AFFINITY", "compact")  # read as an OpenMP runtime loads: not joined
    assert ForkServer.join(path, []) is None
    monkeypatch.delenv("KMP_AFFINITY")
    package = process.package_pythonpath()  # the package's folder named again (the GPU check's script): joined
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, (package, os.environ.get("PYTHONPATH")))))
    named_twice = ForkServer.join(path, [])
    assert named_twice is not None
    named_twice.close()
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, (os.environ["PYTHONPATH"], "/elsewhere"))))
    assert ForkServer.join(path, []) is None  # another folder to import from: not joined
    assert ForkServer.join(str(tmp_path / "nobody.sock"), ["torch"]) is None
    assert forkserver.what_a_fork_keeps({"OMP_WAIT_POLICY": "PASSIVE"})["env"]["OMP_WAIT_POLICY"] == "PASSIVE"


def test_importing_what_a_runs_parent_imports_keeps_it_on_the_zygote():
    """scikit-learn (the fidelity data) sets two OpenMP variables as it loads: a process that imported it
    once lost the tests' zygote, and every later run in it imported torch for a server of its own."""
    import subprocess
    code = ("import os; from amp_bench.launchers.forkserver import what_a_fork_keeps as keeps; "
            "before = keeps(os.environ); import sklearn.datasets, scipy.stats, pandas, plotly.graph_objects, rich; "
            "print(before == keeps(os.environ))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["True"], out.stdout + out.stderr


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "pidfd_open"),
                    reason="a zygote's server watches its run through a pidfd (Linux 5.3+)")
def test_a_run_killed_outright_takes_its_case_with_it_and_the_zygote_serves_on(zygote, write_suite, tmp_path):
    """SIGKILL of a run's parent: a run's own server dies with it (PR_SET_PDEATHSIG); a zygote's
    server sees its parent hang up, kills the running case's session and ends."""
    import signal
    import subprocess
    import time
    proc, path = zygote
    suite = write_suite("models: [{ref: 'python:toy_models:sleeps', options: {seconds: 600}}]\nbatch_sizes: [4]\n"
                        "precisions: [fp32]\nwarmup_steps: 1\nsteps: 3\ntimeout_s: 300\nexplain: false\n")
    run = subprocess.Popen([sys.executable, "-m", "amp_bench", "run", str(suite), "--device", "cpu", "--no-report",
                            "--results-dir", str(tmp_path / "results")],
                           env={**os.environ, forkserver.ZYGOTE_ENV: path},
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (list((tmp_path / "results").glob("*/logs/*sleeps*"))
                                               and len(_descendants(proc.pid)) >= 2):
        time.sleep(0.2)  # the case's log is open and its child forked (the run's server, then the case)
    assert len(_descendants(proc.pid)) >= 2, "the case never started"
    run.send_signal(signal.SIGKILL)
    run.wait()
    deadline = time.monotonic() + 20
    while _descendants(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _descendants(proc.pid) == [] and proc.poll() is None


# What a GPU host's imports leave in the fork server, without a GPU: driver libraries of the same names that
# answer as NVIDIA's do (CUDA_ERROR_NOT_INITIALIZED and NVML_ERROR_UNINITIALIZED until their init calls).
FAKE_DRIVERS = {
    "libcuda.so.1": "static int up; int cuInit(unsigned f) { up = 1; return 0; }\n"
                    "int cuDeviceGetCount(int *n) { if (!up) return 3; *n = 1; return 0; }\n",
    "libnvidia-ml.so.1": "static int up; int nvmlInit_v2(void) { up = 1; return 0; }\n"
                         "int nvmlDeviceGetCount_v2(unsigned *n) { if (!up) return 1; *n = 1; return 0; }\n",
}


@pytest.fixture(scope="module")
def fake_drivers(tmp_path_factory):
    """The fake driver libraries, built with the machine's C compiler; a third, libcuda.so.1 of an old
    driver that has no cuDeviceGetCount to ask, in a folder of its own."""
    import shutil
    import subprocess
    folder = tmp_path_factory.mktemp("drivers")
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to build the fake driver libraries")
    sources = {**FAKE_DRIVERS, "old/libcuda.so.1": "int cuInit(unsigned f) { return 0; }\n"}
    for name, source in sources.items():
        (folder / name).parent.mkdir(exist_ok=True)
        (folder / f"{name}.c").write_text(source)
        subprocess.run([compiler, "-shared", "-fPIC", "-o", str(folder / name), str(folder / f"{name}.c")],
                       check=True, capture_output=True)
    return folder


def _verdict_after(imports: str, tmp_path) -> str:
    """unsafe_to_fork() in a fresh interpreter after `imports` ran (what a preload would do)."""
    import subprocess
    code = f"import ctypes, threading, time\n{imports}\nfrom amp_bench.platform.forking import unsafe_to_fork\n" \
           "print(repr(unsafe_to_fork()))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": str(Path(amp_bench.__file__).parents[1])})
    assert out.returncode == 0, out.stderr
    return eval(out.stdout.strip())


def test_a_driver_library_loaded_but_not_initialised_lets_the_server_fork(fake_drivers, tmp_path):
    load = "".join(f"ctypes.CDLL('{fake_drivers / name}', mode=ctypes.RTLD_GLOBAL)\n" for name in FAKE_DRIVERS)
    assert _verdict_after(load, tmp_path) == ""  # mapped, as `import torch` maps libcuda on a GPU host
    cuda = f"ctypes.CDLL('{fake_drivers / 'libcuda.so.1'}', mode=ctypes.RTLD_GLOBAL).cuInit(0)"
    assert _verdict_after(load + cuda, tmp_path) == "an import initialised the CUDA driver in the fork server"
    nvml = f"ctypes.CDLL('{fake_drivers / 'libnvidia-ml.so.1'}', mode=ctypes.RTLD_GLOBAL).nvmlInit_v2()"
    assert _verdict_after(load + nvml, tmp_path) == "an import initialised NVML in the fork server"
    old = f"ctypes.CDLL('{fake_drivers / 'old' / 'libcuda.so.1'}', mode=ctypes.RTLD_GLOBAL)"
    assert _verdict_after(old, tmp_path) == ("an import loaded libcuda.so.1, which could not say whether it is "
                                             "initialised in the fork server")
    pool = "threading.Thread(target=time.sleep, args=(60,), name='pool-worker', daemon=True).start()"
    said = _verdict_after(load + pool, tmp_path)
    assert said.startswith("the fork server runs 2 threads after its imports (") and "pool-worker" in said


@pytest.mark.slow
def test_on_a_gpu_like_host_the_run_forks_its_workers_and_a_refusal_is_one_console_line(
        fake_drivers, write_suite, tmp_path, own_fork_server):
    """A model library that maps the driver libraries as it imports (as torch does on a GPU host): the run's
    server preloads it and still forks every worker; one that also initialises CUDA is refused, and the run
    says why in one line as it starts."""
    maps = "".join(f"ctypes.CDLL('{fake_drivers / name}', mode=ctypes.RTLD_GLOBAL)\n" for name in FAKE_DRIVERS)
    suite = write_suite("models: [{ref: 'python:gpu_host_models:mlp', label: mlp}]\nbatch_sizes: [4]\n"
                        "precisions: [fp32]\nwarmup_steps: 1\nsteps: 2\nexplain: false\ntimeout_s: 60\n")
    models = tmp_path / "gpu_host_models.py"
    models.write_text(f"import ctypes\n{maps}from toy_models import mlp\n")
    rows = amp_bench.run_suite(suite, device="cpu", results_dir=tmp_path / "mapped")
    assert list(rows["status"]) == ["ok"] and list(rows["worker_start"]) == ["fork"]
    models.write_text(f"import ctypes\n{maps}ctypes.CDLL('{fake_drivers / 'libcuda.so.1'}').cuInit(0)\n"
                      "from toy_models import mlp\n")
    notes = []
    reporter = type("Notes", (amp_bench.studies.benchmark.Reporter,), {"note": lambda self, text: notes.append(text)})
    rows = amp_bench.run_suite(suite, device="cpu", results_dir=tmp_path / "initialised", reporter=reporter())
    assert list(rows["status"]) == ["ok"] and list(rows["worker_start"]) == ["spawn"]
    assert notes == ["workers start as fresh interpreters, each paying its own imports: the fork server was not "
                     "used (an import initialised the CUDA driver in the fork server)"]
