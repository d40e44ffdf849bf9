"""The fork server (amp_bench/launchers/forkserver.py): each case a fresh child of one process that imported
torch once; the server never touches CUDA or starts threads; children are apart from each other; a child
that crashes or hangs costs its own row only; where the server cannot be used, workers spawn as before."""
import sys
import types

import pytest

import amp_bench
from amp_bench.suite.model_refs import preload_modules
from amp_bench.launchers import forkserver
from amp_bench.launchers.forkserver import ForkServer, launch


def test_a_server_that_could_not_fork_safely_says_why():
    """The checks the server runs on itself after its imports (here on stand-ins for what they read)."""
    initialised = types.SimpleNamespace(cuda=types.SimpleNamespace(is_initialized=lambda: True))
    saved = sys.modules.get("torch")
    sys.modules["torch"] = initialised
    try:
        assert forkserver.unsafe_to_fork() == "an import initialised CUDA in the fork server"
    finally:
        sys.modules["torch"] = saved
    assert forkserver.forkable_env({"TORCHINDUCTOR_CACHE_DIR": "/x", "AMP_BENCH_EXPLAIN_TRACE": "/t"})
    assert not forkserver.forkable_env({"OMP_NUM_THREADS": "1"})  # read as torch loads: the case spawns
    assert not forkserver.forkable_env({"CUDA_VISIBLE_DEVICES": "1"})


def test_preloads_name_what_a_worker_imports_without_importing_it():
    names = preload_modules(["torchvision/resnet18", "transformers/gpt2", "python:toy_models:mlp"])
    assert names[:2] == ["torch", "torch._dynamo"]
    assert {"torchvision.models", "transformers.models.gpt2.modeling_gpt2", "toy_models"} <= set(names)
    assert "amp_bench.measure.case" in names


@pytest.mark.slow
def test_the_server_imports_without_touching_cuda_or_starting_threads_and_forks_probes(tmp_path):
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
    first's (each child is reaped apart, and its high-water mark starts at the server's pages). A child that exits outright, and one cut at its deadline, leave the server forking the next."""
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
    assert "code 3" in rows.loc["dies", "reason"]
    mib = 2**20
    # the training steps' high-water mark (VmHWM): the small child does not carry the ballast's 256 MiB
    assert rows.loc["ballast", "peak_rss_bytes"] - rows.loc["small", "peak_rss_bytes"] > 200 * mib
    assert rows.loc["small", "worker_start_s"] < 5  # launch to first step: no imports left to pay
    small = write_suite("models: [{ref: 'python:toy_models:mlp', label: small}]\nbatch_sizes: [4]\n"
                        "precisions: [fp32]\nwarmup_steps: 1\nsteps: 3\nexplain: false\n", name="small.yaml")
    spawned = amp_bench.run_suite(small, device="cpu", results_dir=tmp_path / "spawned", isolation="spawn")
    assert list(spawned["worker_start"]) == ["spawn"] and list(spawned["status"]) == ["ok"]
