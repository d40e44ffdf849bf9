"""Every bad suite gets one clear line per problem naming file and field, exit code 2, no traceback."""
import subprocess
import sys

import pytest

from amp_bench.errors import SuiteError
from amp_bench.suite import load_suite
from conftest import ROOT, amp_bench_cli

GOOD = """
models: [torchvision/resnet18]
batch_sizes: [2, 4]
precisions: [fp32, amp_bf16]
"""


def problems(write_suite, text):
    path = write_suite(text)
    with pytest.raises(SuiteError) as info:
        load_suite(path)
    for line in info.value.lines:
        assert line.startswith(str(path)), line
        assert "\n" not in line
    return info.value.lines


def test_good_suite_expands_to_the_matrix(write_suite):
    suite = load_suite(write_suite(GOOD))
    cases = suite.cases("cpu")
    assert [(c.batch_size, c.precision) for c in cases] == [(2, "fp32"), (2, "amp_bf16"), (4, "fp32"), (4, "amp_bf16")]
    assert cases[0].case_id == "resnet18-bs2-224px-fp32"
    assert cases[0].group_id == cases[1].group_id != cases[2].group_id


def test_a_model_entry_can_turn_explain_on_or_off_for_itself(write_suite):
    suite = load_suite(write_suite("""
models:
  - {ref: torchvision/resnet18, explain: false}
  - {ref: torchvision/resnet18, label: r18-explained, explain: true}
  - {ref: torchvision/resnet18, label: r18-suite}
batch_sizes: [2]
precisions: [fp32]
explain: false
"""))
    assert [(c.model.label, c.explain) for c in suite.cases("cpu")] == [
        ("resnet18", False), ("r18-explained", True), ("r18-suite", False)]
    lines = problems(write_suite, "models: [{ref: torchvision/resnet18, explain: sometimes}]\nbatch_sizes: [2]\n")
    assert len(lines) == 1 and "models[0].explain" in lines[0]


def test_cpu_block_overrides_top_level_on_cpu_only(write_suite):
    suite = load_suite(write_suite(GOOD + "steps: 50\ncpu:\n  batch_sizes: [1]\n  steps: 3\n"))
    cpu, cuda = suite.cases("cpu"), suite.cases("cuda")
    assert {c.batch_size for c in cpu} == {1} and {c.steps for c in cpu} == {3}
    assert {c.batch_size for c in cuda} == {2, 4} and {c.steps for c in cuda} == {50}
    assert {c.cpu_allocator for c in cpu} == {"keep"}  # the default
    assert {c.cpu_allocator
            for c in load_suite(write_suite(GOOD + "cpu_allocator: system\n")).cases("cpu")} == {"system"}


@pytest.mark.parametrize("text, expected", [
    (GOOD + "bach_size: 3\n", "bach_size: unknown key (did you mean 'batch_sizes'?"),
    (GOOD + "cpu:\n  stpes: 3\n", "cpu.stpes: unknown key (did you mean 'steps'?"),
    (GOOD + "optimizer: {name: sgd, implementation: fused}\n", "optimizer.implementation: unknown key"),
    (GOOD + "steps: ten\n", "steps: expected an integer between 1 and 1000000, got 'ten' (str)"),
    (GOOD + "channels_last: 1\n", "channels_last: expected true or false, got 1 (int)"),
    (GOOD + "repeats: 2.5\n", "repeats: expected an integer between 1 and 1000, got 2.5 (float)"),
    (GOOD + "timeout_s: -1\n", "timeout_s: expected a number > 0"),
    (GOOD + "cpu:\n  cpu_allocator: jemalloc\n", "cpu.cpu_allocator: expected one of keep, system, got 'jemalloc'"),
    (GOOD.replace("[2, 4]", "[2, 0]"), "batch_sizes[1]: expected a batch size between 1 and 65536, got 0"),
    (GOOD.replace("[2, 4]", "[-8]"), "batch_sizes[0]: expected a batch size between 1 and 65536, got -8"),
    (GOOD.replace("[2, 4]", "[10000000]"), "batch_sizes[0]: expected a batch size between 1 and 65536, got 10000000"),
    (GOOD.replace("[2, 4]", "[true]"), "batch_sizes[0]: expected a batch size between 1 and 65536, got True (bool)"),
    (GOOD.replace("torchvision/resnet18", "torchvision/resnet51"), "models[0]: unknown torchvision model 'resnet51'"),
    (GOOD.replace("torchvision/resnet18", "transformers/gtp2"),
     "models[0]: unknown transformers model_type 'gtp2' (did you mean 'gpt2'?)"),
    (GOOD.replace("torchvision/resnet18", "resnet18"),
     "models[0]: unknown model reference 'resnet18' (expected torchvision/<name>"),
    (GOOD.replace("torchvision/resnet18", "python:no_such_module:build"),
     "models[0]: cannot import module 'no_such_module'"),
    (GOOD.replace("torchvision/resnet18", "python:toy_models:no_such_fn"),
     "models[0]: module 'toy_models' has no callable 'no_such_fn'"),
    (GOOD.replace("[torchvision/resnet18]", "[{ref: transformers/gpt2, config: {n_layers: 2}}]"),
     "models[0].config.n_layers: not an attribute of GPT2Config"),
    (GOOD.replace("amp_bf16", "fp16"),
     "precisions[1]: expected one of fp32, tf32, amp_fp16, amp_bf16, fp8, got 'fp16'"),
    (GOOD.replace("[2, 4]", "[]"), "batch_sizes: empty list: the matrix has no cases"),
    (GOOD.replace("[torchvision/resnet18]", "[]"), "models: empty list: the matrix has no cases"),
    (GOOD.replace("[2, 4]", "[4, 4]"), "batch_sizes[1]: duplicate case: 4 is already listed at batch_sizes[0]"),
    (GOOD.replace("[fp32, amp_bf16]", "[fp32, fp32]"), "precisions[1]: duplicate case"),
    (GOOD.replace("[torchvision/resnet18]", "[torchvision/resnet18, torchvision/resnet18]"),
     "models[1]: duplicate case: label 'resnet18' is already used by models[0]"),
    ("batch_sizes: [1]\n", "models: missing"),
    ("- a\n- b\n", "expected a mapping at the top level, got list"),
    ("", "empty suite file"),
])
def test_each_problem_gets_a_clear_line(write_suite, text, expected):
    lines = problems(write_suite, text)
    assert any(expected in line for line in lines), lines


def test_several_problems_are_all_reported(write_suite):
    lines = problems(write_suite, GOOD.replace("[2, 4]", "[0, -1]").replace("amp_bf16", "amp_bf17") + "stepz: 1\n")
    assert len(lines) == 4, lines


def test_invalid_yaml_names_line_and_column(write_suite):
    lines = problems(write_suite, "models: [torchvision/resnet18\nbatch_sizes: [1]\n")
    assert len(lines) == 1 and "invalid YAML" in lines[0]
    assert lines[0].split(": ")[0].count(":") == 2  # path:line:col


def test_missing_file(tmp_path):
    with pytest.raises(SuiteError) as info:
        load_suite(tmp_path / "nope.yaml")
    assert info.value.lines == [f"{tmp_path / 'nope.yaml'}: suite file not found"]


def test_overrides_are_validated_like_the_file(write_suite):
    suite = load_suite(write_suite(GOOD))
    with pytest.raises(SuiteError, match="override.batch_sizes\\[0\\]: expected a batch size"):
        suite.cases("cpu", {"batch_sizes": [0]})
    assert [c.steps for c in suite.cases("cpu", {"steps": 7})] == [7] * 4


@pytest.mark.parametrize("suite", sorted((ROOT / "suites").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_suites_are_valid(suite):
    loaded = load_suite(suite)
    if loaded.has_matrix:
        assert loaded.cases("cpu") and loaded.cases("cuda")
    else:  # a study-only suite
        assert loaded.fidelity_spec("cpu").precisions[0] == "fp32"
        assert loaded.fidelity_spec("cuda").model in ("torchvision/resnet18", "small_cnn")  # gpu_check: the small CNN


def test_resnet50_suites_gpu_block_is_every_mode_at_the_anchor_case_with_repeats_sharing_a_worker():
    """The main job on a GPU: bs 256 channels_last (the published anchors'), every mode, each mode's repeats
    as windows of one worker, adaptive windows inside a run budget; on the CPU each repeat its own worker."""
    suite = load_suite(ROOT / "suites" / "resnet50.yaml")
    cuda = suite.cases("cuda")
    assert {(c.batch_size, c.channels_last) for c in cuda} == {(256, True)}
    assert {c.precision for c in cuda} == {"fp32", "tf32", "amp_fp16", "amp_bf16"}
    assert {(c.repeats, c.repeats_per_worker) for c in cuda} == {(3, 3)}
    assert all(c.target_ci and c.budget_s and c.min_steps < c.max_steps for c in cuda)
    cpu = suite.cases("cpu")
    assert {c.precision for c in cpu} >= {"fp32", "amp_bf16"} and {c.repeats_per_worker for c in cpu} == {1}


def test_cli_validate_exit_code_2_one_line_per_problem_no_traceback(write_suite):
    path = write_suite(GOOD.replace("[2, 4]", "[0]") + "stepz: 1\n")
    proc = amp_bench_cli("validate", path)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 2, proc.stderr
    assert all(line.startswith(f"error: {path}: ") for line in lines)
    assert "Traceback" not in proc.stderr + proc.stdout


def test_cli_validate_ok(write_suite):
    proc = amp_bench_cli("validate", write_suite(GOOD))
    assert proc.returncode == 0, proc.stderr
    assert "ok" in proc.stdout


@pytest.mark.parametrize("text, expected", [
    (GOOD.replace("[torchvision/resnet18]", '[{ref: torchvision/resnet18, label: "mlp/v2"}]'),
     "models[0].label: expected a label of letters, digits"),
    (GOOD.replace("[torchvision/resnet18]", '[{ref: torchvision/resnet18, label: "../../x"}]'),
     "models[0].label: expected a label"),
    (GOOD.replace("[torchvision/resnet18]", "[{ref: transformers/gpt2, config: {1: 2}}]"),
     "models[0].config: keys must be attribute names, got 1"),
    (GOOD.replace("[torchvision/resnet18]", "[{ref: 5}]"), "models[0].ref: expected a non-empty string, got 5"),
    (GOOD + "device: tpu\n", "device: expected auto, cpu, cuda or cuda:N, got 'tpu'"),
])
def test_more_problems_get_one_line(write_suite, text, expected):
    lines = problems(write_suite, text)
    assert len(lines) == 1 and expected in lines[0], lines


def test_yaml_exponents_and_cuda_index_are_accepted(write_suite):
    suite = load_suite(write_suite(GOOD + "device: cuda:1\ntimeout_s: 1e3\n"
                                          "optimizer: {name: adamw, impl: foreach, lr: 1e-3, weight_decay: 1e-4}\n"))
    case = suite.cases("cuda")[0]
    assert suite.device == "cuda:1" and case.timeout_s == 1000.0
    assert case.optimizer.lr == 0.001 and case.optimizer.weight_decay == 0.0001


def test_api_overrides_accept_tuples(write_suite):
    suite = load_suite(write_suite(GOOD))
    assert {c.precision for c in suite.cases("cpu", {"precisions": ("fp32", "amp_bf16")})} == {"fp32", "amp_bf16"}


def test_peak_tflops_number_or_per_precision(write_suite):
    suite = load_suite(write_suite(GOOD + "peak_tflops: {fp32: 2.5, amp_bf16: 10}\n"))
    assert {c.precision: c.peak_tflops for c in suite.cases("cpu")} == {"fp32": 2.5, "amp_bf16": 10.0}
    suite = load_suite(write_suite(GOOD + "peak_tflops: 4\n"))
    assert {c.peak_tflops for c in suite.cases("cpu")} == {4.0}
    lines = problems(write_suite, GOOD + "peak_tflops: {fp64: 1}\n")
    assert any("peak_tflops.fp64: unknown key" in line for line in lines), lines


def test_model_names_are_checked_without_running_the_users_module_or_importing_transformers(tmp_path):
    """A top-level def is found in the module's source (running it would import torch: 1.7 s in the
    parent); a name bound any other way, or missing, is imported to be sure. A config key the
    transformers source declares needs no import; an unknown one still gets its line."""
    (tmp_path / "side_effects.py").write_text(
        "import pathlib\npathlib.Path(__file__).with_name('ran').touch()\n"
        "def build(**options):\n    return None\n\nalias = build\n")
    script = f"""
import sys
from amp_bench.suite.model_refs import check_model
dirs = ({str(tmp_path)!r},)
assert check_model("python:side_effects:build", search_dirs=dirs) == []
assert "side_effects" not in sys.modules
assert check_model("transformers/gpt2", config={{"n_layer": 2, "n_embd": 64, "hidden_size": 64}}) == []
assert not [m for m in sys.modules if m.startswith(("transformers", "torch"))], "imported"
print(check_model("python:side_effects:alias", search_dirs=dirs))
print(check_model("python:side_effects:missing", search_dirs=dirs))
print(check_model("transformers/gpt2", config={{"n_layers": 2}}))
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    alias, missing, config = proc.stdout.splitlines()
    assert alias == "[]" and (tmp_path / "ran").exists()  # not a def: imported, and it resolved
    assert "module 'side_effects' has no callable 'missing'" in missing
    assert "('.config.n_layers', 'not an attribute of GPT2Config')" in config
