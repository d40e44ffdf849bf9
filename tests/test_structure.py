"""The code's structure holds what the design promises: no import circle, analysis without torch,
one definition of a precision mode, of throughput and of a case's set-up, and small modules."""
import ast
import functools
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from amp_bench import BASE as BASE_NAMES
from amp_bench import LAYERS, modes
from conftest import ROOT

PACKAGE = ROOT / "amp_bench"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package_names() -> dict[str, str]:
    """The package's public names (amp_bench/__init__.py: run_suite, load_results, ...) -> the module each
    resolves to (the lazy import inside it): `from amp_bench import run_suite` imports that module."""
    found = {}
    for node in ast.parse((PACKAGE / "__init__.py").read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef):
            inner = [n.module for n in ast.walk(node) if isinstance(n, ast.ImportFrom) and n.module]
            if inner:
                found[f"amp_bench.{node.name}"] = inner[0]
    return found


@functools.cache
def _parsed(path: Path) -> ast.Module:
    """A file's syntax tree, parsed once for every check of this file that reads it (ast.walk only reads)."""
    return ast.parse(path.read_text(encoding="utf-8"))


def _import_graph() -> dict[str, set[str]]:
    """module -> the amp_bench modules it imports, at module level or inside functions alike (a copy a call)."""
    return {module: set(targets) for module, targets in _graph_once().items()}


@functools.cache
def _graph_once() -> dict[str, set[str]]:
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in files}
    resolves = _package_names()
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(_parsed(path)):
            targets = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] +
                                    ([base] if base else []))
                # `from pkg import sub` imports the submodule sub; `from amp_bench import run_suite` the module
                # the package's name resolves to
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else
                           resolves.get(f"{base}.{a.name}", base) for a in node.names]
            graph[name] |= {t for t in targets if t in files and t != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    state: dict[str, int] = {}
    cycles = []

    def visit(node, stack):
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return cycles


def test_the_circle_check_can_fail():
    assert _cycles({"w": {"d"}, "d": {"w"}, "x": set()}) == [["d", "w", "d"]]
    assert _cycles({"w": {"d"}, "d": set()}) == []


def test_no_import_circle_in_the_package():
    graph = _import_graph()
    assert "amp_bench.measure.ddp" in graph["amp_bench.worker"]  # the graph was really read
    assert not _cycles(graph), "import circles: " + "; ".join(" -> ".join(c) for c in _cycles(graph))


BASE = {f"amp_bench.{name}" for name in BASE_NAMES}  # the shared base (amp_bench/__init__.py's BASE)


def _layer(module: str) -> str | None:
    """A module's layer: its folder, or a top-level module's own name ("__init__" for the package); None for
    the base."""
    parts = module.split(".")
    name = parts[1] if len(parts) > 1 else "__init__"
    return name if name in LAYERS else None


def _allowance(layer: str, target: str) -> str | None:
    """The entry of LAYERS[layer] that lets it import target (a layer, or one module of it); None if none does."""
    rest = target.split(".", 1)[1]
    return next((a for a in sorted(LAYERS[layer]) if _layer(target) == a or rest == a or rest.startswith(a + ".")),
                None)


def _layer_violations(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for module, targets in graph.items():
        layer = _layer(module)
        if layer is None:  # the base imports the base only
            assert module in BASE, f"{module}: in no layer and not in the base (amp_bench/__init__.py)"
            bad += [f"{module} -> {target}" for target in targets if target not in BASE]
            continue
        bad += [f"{module} -> {target}" for target in targets
                if target not in BASE and _layer(target) != layer and _allowance(layer, target) is None]
    return sorted(bad)


def _unused_allowances(graph: dict[str, set[str]]) -> list[str]:
    """LAYERS entries no module's import needs: a door in the table that nothing walks through."""
    used = {(_layer(module), _allowance(_layer(module), target)) for module, targets in graph.items()
            if _layer(module) is not None for target in targets if target not in BASE}
    return sorted(f"{layer} -> {a}" for layer, allowed in LAYERS.items() for a in allowed if (layer, a) not in used)


def test_a_name_imported_from_the_package_counts_as_the_module_it_resolves_to():
    assert _package_names()["amp_bench.run_suite"] == "amp_bench.studies.benchmark"
    assert _package_names()["amp_bench.load_results"] == "amp_bench.store.results"


def test_the_layer_check_can_fail():
    graph = {"amp_bench.analysis.compare": {"amp_bench.measure.case", "amp_bench.store.results", "amp_bench.stats"},
             "amp_bench.measure.case": {"amp_bench.platform.device"},
             "amp_bench.modes": {"amp_bench.stats", "amp_bench.store.flags"},
             "amp_bench.pytest_plugin": {"amp_bench.studies.benchmark_fixture", "amp_bench.cli"}}
    assert _layer_violations(graph) == ["amp_bench.analysis.compare -> amp_bench.measure.case",
                                        "amp_bench.modes -> amp_bench.store.flags",
                                        "amp_bench.pytest_plugin -> amp_bench.cli"]


def test_the_unused_allowance_check_can_fail():
    graph = {"amp_bench.report.render": {"amp_bench.analysis.compare", "amp_bench.stats"}}
    unused = _unused_allowances(graph)
    assert "report -> store" in unused and "report -> analysis" not in unused


def test_the_layer_table_allows_only_imports_that_are_made():
    unused = _unused_allowances(_import_graph())
    assert not unused, "LAYERS allows imports no module makes (remove them, and from the README's table): " + \
        "; ".join(unused)


def test_every_module_is_in_a_layer_or_the_base():
    assert all(_layer(module) is not None or module in BASE for module in _import_graph())


def test_imports_go_down_the_layers():
    """cli and worker -> studies -> executors, launchers -> measure -> platform, suite, stats; report -> analysis ->
    store -> stats, modes, errors. Analysis, store and report never import measure, launchers, executors or studies."""
    violations = _layer_violations(_import_graph())
    assert not violations, "imports against the layers: " + "; ".join(violations)


def test_no_two_modules_share_a_file_name():
    """A name says what a module holds: `run.py` in two folders says neither (packages' own __init__
    and __main__ aside)."""
    names: dict[str, list[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name not in ("__init__.py", "__main__.py"):
            names.setdefault(path.name, []).append(str(path.relative_to(PACKAGE)))
    assert not {name: paths for name, paths in names.items() if len(paths) > 1}


ISSUE_NUMBER = re.compile(r"\bissues? #?\d+", re.IGNORECASE)


def test_the_issue_number_check_can_fail():
    assert ISSUE_NUMBER.search("# retried at the end (issue 47)")
    assert ISSUE_NUMBER.search('"""the fuller record is Issue #3\'s"""')
    assert not ISSUE_NUMBER.search("# an issue the user files")


def test_no_comment_says_issue_n_instead_of_what_it_means():
    """A reader of the code has no issue tracker: a comment says what the code does and why."""
    found = [f"{path.relative_to(ROOT)}:{number}" for path in PACKAGE.rglob("*.py")
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if ISSUE_NUMBER.search(line)]
    assert not found


def test_the_top_level_holds_at_most_eight_modules():
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= 8, top


TORCH_FREE = ["amp_bench.analysis.compare", "amp_bench.analysis.gate.history", "amp_bench.analysis.gate.nightly",
              "amp_bench.analysis.speedups", "amp_bench.analysis.headline", "amp_bench.analysis.fidelity",
              "amp_bench.analysis.headroom", "amp_bench.report", "amp_bench.report.data", "amp_bench.report.charts",
              "amp_bench.report.render", "amp_bench.report.study_sections", "amp_bench.store.results",
              "amp_bench.store.cache", "amp_bench.store.ingest", "amp_bench.store.run_state",
              "amp_bench.executors.job_states", "amp_bench.cli.status", "amp_bench.stats", "amp_bench.modes",
              "amp_bench.studies.fidelity.orchestration", "amp_bench.studies.headroom_search"]
# One fresh interpreter imports the libraries these modules stand on (none of them imports torch: checked),
# then forks a child per module that imports it: each module is checked as a fresh interpreter would load
# it, without 22 interpreters importing pandas again (~0.3 s of CPU each).
FORK_EACH = """
import json, os, sys
import numpy, pandas, plotly.graph_objects, rich.console, scipy.stats, yaml
assert not [m for m in sys.modules if m.split(".")[0] == "torch"], "a library below amp_bench imports torch"
found = {}
for module in sys.argv[1:]:
    read, write = os.pipe()
    if os.fork() == 0:
        try:  # a child that fails to import writes nothing
            __import__(module)
            os.write(write, json.dumps(sorted(m for m in sys.modules if m.split(".")[0] == "torch")).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        found[module] = json.loads(pipe.read() or '["(the import failed)"]')
    os.wait()
print(json.dumps(found))
"""


@pytest.fixture(scope="module")
def torch_modules_each_imports():
    out = subprocess.run([sys.executable, "-c", FORK_EACH, *TORCH_FREE], cwd=ROOT, capture_output=True, text=True,
                         timeout=120, check=True)
    return json.loads(out.stdout)


@pytest.mark.parametrize("module", TORCH_FREE)
def test_reading_and_analysing_results_does_not_import_torch(module, torch_modules_each_imports):
    assert torch_modules_each_imports[module] == [], f"{module} imports torch"


def test_the_torch_import_check_can_fail(tmp_path):
    """A module that imports torch (a stand-in torch here: the check only looks at module names) is caught."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("")
    (tmp_path / "imports_torch.py").write_text("import torch\n")
    out = subprocess.run([sys.executable, "-c", FORK_EACH, "amp_bench.modes", "imports_torch", "no_such_module"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120, check=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path),
                                                                                       os.environ.get("PYTHONPATH")]))})
    assert json.loads(out.stdout) == {"amp_bench.modes": [], "imports_torch": ["torch"],
                                      "no_such_module": ["(the import failed)"]}


MAX_FUNCTION_LINES = 60  # a function read at a glance; a module may be as long as its one concept needs


def long_functions(paths, root: Path = ROOT) -> dict[str, int]:
    """'file:line name' -> lines, for every function or method longer than MAX_FUNCTION_LINES."""
    long = {}
    for path in paths:
        for node in ast.walk(_parsed(path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long[f"{path.relative_to(root)}:{node.lineno} {node.name}"] = lines
    return long


def test_no_function_over_60_lines():
    long = long_functions(PACKAGE.rglob("*.py"))
    assert not long, long


def test_the_function_length_check_can_fail(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    (tmp_path / "long.py").write_text(f"def long():\n{body}\n\n\ndef short():\n    return 1\n")
    assert long_functions([tmp_path / "long.py"], tmp_path) == {"long.py:1 long": MAX_FUNCTION_LINES + 1}


# --------------------------------------------------------------------------- typed at the store's door

def read_back_repairs(source: str) -> list[int]:
    """Lines that repair what the store reads back typed (store/typed.py): `pd.to_numeric`, a comparison
    with the text "True" or "nan", `.astype(bool)`."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name == "to_numeric" or (name == "astype" and node.args and getattr(node.args[0], "id", "") == "bool"):
                lines.append(node.lineno)
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            sides += [e for side in sides if isinstance(side, (ast.Tuple, ast.List, ast.Set)) for e in side.elts]
            if any(isinstance(side, ast.Constant) and side.value in ("True", "nan") for side in sides):
                lines.append(node.lineno)
    return sorted(set(lines))


def test_the_read_back_repair_check_can_fail():
    source = ('x = pd.to_numeric(t["a"])\nok = v in (True, "True")\nif r != "nan":\n    pass\n'
              'y = t["b"].astype(bool)\nz = t["c"].astype(int)\nplot(group="True")\n')
    assert read_back_repairs(source) == [1, 2, 3, 5]


def test_no_reader_outside_the_store_repairs_a_column():
    """Every table comes back typed from the store (results, samples, the study tables): a reader
    outside store/ takes its columns as they come, never converting or comparing text again."""
    found = {str(p.relative_to(PACKAGE)): read_back_repairs(p.read_text(encoding="utf-8"))
             for p in PACKAGE.rglob("*.py") if "store" not in p.relative_to(PACKAGE).parts}
    assert not {name: lines for name, lines in found.items() if lines}


# --------------------------------------------------------------------------- one seam per device

DEVICE_TYPES = {"cpu", "cuda", "xpu", "mps", "hip", "rocm"}


def _device_branches(source: str) -> list[int]:
    """Lines that compare something with a device type ("cuda", ...) or compare a device's type
    (`device_type`, `x.type`): the branches the per-device objects (measure/devices/) replace."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        sides += [e for side in sides if isinstance(side, (ast.Tuple, ast.List, ast.Set)) for e in side.elts]
        for side in sides:
            if (isinstance(side, ast.Constant) and side.value in DEVICE_TYPES) or \
                    (isinstance(side, ast.Name) and side.id == "device_type") or \
                    (isinstance(side, ast.Attribute) and side.attr in ("type", "device_type")):
                lines.append(node.lineno)
                break
    return sorted(lines)


def test_the_device_branch_check_can_fail():
    assert _device_branches("if device.type == 'cuda':\n    pass\nx = a if device_type != 'cpu' else b\n"
                            "y = kind in ('xpu',)\n") == [1, 3, 4]
    assert _device_branches("if backend == 'nccl':\n    pass\nops = for_device(device)\n") == []


MEASURING = sorted(str(p.relative_to(PACKAGE)) for p in (PACKAGE / "measure").rglob("*.py")
                   if "devices" not in p.relative_to(PACKAGE).parts) + ["studies/benchmark_fixture.py"]


@pytest.mark.parametrize("module", MEASURING)
def test_case_code_asks_the_device_object_instead_of_branching_on_the_device_type(module):
    """A new backend (ROCm, XPU) is one module in measure/devices/: no `== "cuda"` elsewhere."""
    assert not _device_branches((PACKAGE / module).read_text(encoding="utf-8")), \
        f"{module} branches on the device type at lines {_device_branches((PACKAGE / module).read_text())}"


# --------------------------------------------------------------------------- one list of modes

@pytest.fixture
def fake_mode():
    mode = modes.register(modes.Mode("amp_fake8", "amp", "bfloat16", False, "ieee", "fp8", "#123456",
                                     cuda_min_capability=(8, 9), cuda_requirement="fake8 needs cc 8.9",
                                     cpu="never", cpu_requirement="fake8 is a GPU mode"))
    yield mode
    modes.unregister(mode.name)


def test_a_registered_mode_flows_to_gate_suite_summary_and_charts(fake_mode, tmp_path):
    from amp_bench.analysis.speedups import summarize
    from amp_bench.platform.device import DeviceInfo, precision_support
    from amp_bench.report.charts import speedup_chart
    from amp_bench.report.data import claims_table, machine_label
    from amp_bench.suite import load_suite

    h100 = DeviceInfo("cuda", "NVIDIA H100 80GB HBM3", index=0, capability=(9, 0))
    a100 = DeviceInfo("cuda", "NVIDIA A100-SXM4-80GB", index=0, capability=(8, 0))
    assert precision_support("amp_fake8", h100).supported
    assert "fake8 needs cc 8.9" in precision_support("amp_fake8", a100).reason
    assert not precision_support("amp_fake8", DeviceInfo("cpu", "cpu")).supported

    suite_path = tmp_path / "s.yaml"
    suite_path.write_text("models: [torchvision/resnet18]\nbatch_sizes: [8]\nprecisions: [fp32, amp_fake8]\n")
    assert {c.precision for c in load_suite(suite_path).cases("cuda")} == {"fp32", "amp_fake8"}

    rows = []
    for precision, ms in (("fp32", 100.0), ("amp_bf16", 60.0), ("amp_fake8", 40.0)):
        rows.append({"run_id": "r", "suite": "s", "case_id": f"m-bs8-{precision}", "model_label": "m",
                     "batch_size": 8, "precision": precision, "channels_last": False, "image_size": 224,
                     "device": "cuda", "device_name": "NVIDIA H100 80GB HBM3", "architecture": "Hopper",
                     "repeat": 0, "status": "ok", "reason": "", "step_time_ms_median": ms,
                     "throughput": 8 / ms * 1e3, "peak_mem_allocated_bytes": 1e9 * ms / 100})
    summary = summarize(pd.DataFrame(rows))
    assert list(summary["precision"]) == ["fp32", "amp_bf16", "amp_fake8"]  # registry order
    assert summary.set_index("precision").loc["amp_fake8", "speedup_vs_fp32"] == pytest.approx(2.5)
    summary["machine"] = machine_label(summary)
    assert "amp_fake8" in set(claims_table(summary)["precision"])
    figure = speedup_chart(summary, "fp32")
    traces = {trace.name: trace for trace in figure.data}
    assert "amp_fake8" in traces and traces["amp_fake8"].marker.color == "#123456"


# --------------------------------------------------------------------------- one throughput formula

def test_one_throughput_formula_for_worker_ddp_ingest_and_compare(tmp_path):
    from amp_bench.analysis.compare import compare
    from amp_bench.measure import ddp as distributed
    from amp_bench.stats import Window
    from amp_bench.store.ingest import ingest
    from amp_bench.store.results import RunStore

    times_ms = [9.0, 10.0, 11.0, 10.0, 9.5, 10.5]  # symmetric: median == mean, so every path agrees
    batch = 16
    expected = batch * len(times_ms) / (sum(times_ms) / 1e3)

    worker = Window.from_steps(times_ms, batch, seconds=sum(times_ms) / 1e3).throughput

    case = SimpleNamespace(batch_size=batch, steps=len(times_ms), nnodes=1)
    samples = [{"phase": "measure", "step": i, "step_time_ms": t, "loss": 1.0} for i, t in enumerate(times_ms)]
    record = {"status": "ok", "window_s": sum(times_ms) / 1e3, "samples": samples}
    ddp = distributed.aggregate([record], case)["throughput"]

    bench = {"machine_info": {"node": "h"}, "datetime": "2026-11-30T00:00:00",
             "benchmarks": [{"name": "t", "stats": {"median": 0.010, "mean": 0.010, "stddev": 0.0007,
                                                     "rounds": len(times_ms), "data": [t / 1e3 for t in times_ms]},
                             "extra_info": {"case_id": "m-bs16-fp32", "batch_size": batch, "precision": "fp32"}}]}
    json_path = tmp_path / "bench.json"
    json_path.write_text(json.dumps(bench))
    ingested = pd.read_csv(ingest(json_path, tmp_path / "ingested") / "results.csv")["throughput"].iloc[0]

    sides = []
    for name in ("base", "cand"):
        store = RunStore(tmp_path / name, name)
        for repeat in range(3):  # compare judges from three repeats a side
            # the worker writes the window's figure; compare reads that column, never re-derives it
            store.add({"run_id": name, "case_id": "m", "batch_size": batch, "world_size": 1, "repeat": repeat,
                       "status": "ok", "step_time_ms_median": 10.0, "device": "cpu", "peak_rss_bytes": 1,
                       **Window.from_steps(times_ms, batch, seconds=sum(times_ms) / 1e3).to_columns()},
                      [{"run_id": name, "case_id": "m", "precision": "fp32", "repeat": repeat, **s} for s in samples])
        sides.append([str(store.dir)])
    result = compare(*sides)
    via_compare = next(r for r in result.results if r.metric == "throughput").baseline

    assert worker == pytest.approx(expected)
    assert ddp == pytest.approx(expected)
    assert ingested == pytest.approx(expected)
    assert via_compare == pytest.approx(expected)


def test_measured_samples_are_one_definition():
    from amp_bench.stats import measured
    rows = [{"phase": "warmup", "step": 0, "step_time_ms": None}, {"phase": "measure", "step": 1, "step_time_ms": 2.0},
            {"phase": "measure", "step": 2, "step_time_ms": None}]
    assert [r["step"] for r in measured(rows)] == [1]
    assert list(measured(pd.DataFrame(rows))["step"]) == [1]
    assert np.isfinite(measured(pd.DataFrame(rows))["step_time_ms"]).all()


# --------------------------------------------------------------------------- one case set-up

def test_pytest_fixture_sets_a_case_up_through_the_workers_function(monkeypatch, tmp_path):
    """The fixture runs the worker's prepare_case: a failed autocast proof skips it, as it would
    mark the worker's case unsupported; and the cuDNN setting is applied and recorded."""
    import torch

    from amp_bench.measure import case as measure
    from amp_bench.measure import precision
    from amp_bench.studies.benchmark_fixture import run_case_in_benchmark

    suite = tmp_path / "s.yaml"
    (tmp_path / "toy_models.py").write_text((ROOT / "tests" / "fixtures" / "toy_models.py").read_text())
    suite.write_text("models: ['python:toy_models:mlp']\nbatch_sizes: [4]\nprecisions: [fp32, amp_bf16]\n"
                     "allow_emulated: true\nwarmup_steps: 1\nsteps: 2\ncudnn_benchmark: false\nexplain: false\n")

    class Bench:
        extra_info: dict = {}

        def pedantic(self, fn, rounds, iterations, warmup_rounds):
            for _ in range(rounds + warmup_rounds):
                fn()

    calls = []
    real = measure.prepare_case
    monkeypatch.setattr(measure, "prepare_case", lambda *a, **k: calls.append(a[0].case_id) or real(*a, **k))
    torch.backends.cudnn.benchmark = True
    extra = run_case_in_benchmark(Bench(), suite, "mlp-bs4-fp32", device="cpu")
    assert calls == ["mlp-bs4-fp32"]
    assert extra["cudnn_benchmark"] is False and torch.backends.cudnn.benchmark is False

    monkeypatch.setattr(precision, "autocast_engages", lambda mode, device_type: (False, "proof failed here"))
    with pytest.raises(pytest.skip.Exception, match="proof failed here"):
        run_case_in_benchmark(Bench(), suite, "mlp-bs4-amp_bf16", device="cpu")


BASELINE_READERS = ["analysis/speedups.py", "analysis/headline.py", "report/render.py", "report/charts.py",
                    "report/compile_section.py", "report/data.py", "cli/console.py"]
LITERAL_BASELINE = re.compile(r"(speedup|mem_saving|contended)\w*_vs_(fp32|tf32)\b")


def test_the_registry_alone_names_the_benchmarks_baselines():
    """Speedup, memory-saving and contention columns are named after modes.reference() and
    modes.baseline_names() wherever the benchmark summary is read; a literal '_vs_fp32' or '_vs_tf32'
    column there would go stale the day the registry's baseline changes."""
    found = [f"{name}:{i}: {line.strip()}" for name in BASELINE_READERS
             for i, line in enumerate((PACKAGE / name).read_text().splitlines(), start=1)
             if LITERAL_BASELINE.search(line)]
    assert not found, "\n".join(found)
    assert LITERAL_BASELINE.search('summary["speedup_vs_fp32"]')  # the check can fail


def test_the_scripts_import_names_that_exist():
    """benchmarks/ and scripts/ run outside the tests (the GPU check, by hand): a name they import from
    amp_bench that a refactor removed would fail only there, on the rarest machine."""
    import importlib
    missing = []
    for path in sorted([*ROOT.glob("benchmarks/*.py"), *ROOT.glob("scripts/*.py")]):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "amp_bench":
                module = importlib.import_module(node.module)
                missing += [f"{path.name}: {node.module}.{alias.name}" for alias in node.names
                            if not hasattr(module, alias.name) and not _is_submodule(module, alias.name)]
    assert not missing, missing


def _is_submodule(module, name: str) -> bool:
    import importlib.util
    return hasattr(module, "__path__") and importlib.util.find_spec(f"{module.__name__}.{name}") is not None
