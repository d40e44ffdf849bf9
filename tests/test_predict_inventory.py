"""predict's op inventory on real CPU steps: every optimizer form priced (a fused AdamW step was dropped:
its op takes only tensor lists), every op that launches work either priced or named in the output as
left out; which achievable fractions are measured, said per GPU; NeuSight's extract naming what it skips."""
import gzip
import json

import pytest

from amp_bench.analysis.predict import neusight, ops
from amp_bench.analysis.predict.inventory import _cpu_nodes, _window, priced_inventory
from amp_bench.analysis.predict.settings import fraction_label, fractions
from amp_bench.cli import main
from amp_bench.platform.gpu_specs import by_key
from conftest import ROOT

DATA = ROOT / "tests" / "data" / "predict"
STEPS = DATA / "optimizer_steps"  # one real CPU step per AdamW form (benchmarks/predict_fixtures.py optimizers)
PARAMS = 256 * 512 + 512 + 512 * 10 + 10  # the MLP those steps train
REAL_STEPS = [*sorted(STEPS.glob("*.json.gz")), *sorted((DATA / "cpu_run" / "traces").glob("*.json.gz"))]


def _optimizer_bytes(path) -> float:
    return sum(w.bytes for w in priced_inventory(path)[0] if w.category == "optimizer")


def test_a_fused_adamw_step_is_priced_as_one_pass_over_its_state():
    """aten::_fused_adamw_ reads params, grads, exp_avg and exp_avg_sq and writes three of them back, once
    (28 bytes an FP32 element); the foreach form's eight passes (lerp, mul, addcmul, sqrt, div, add,
    addcdiv and the decay's mul) move three times that. Before, the fused step priced at 32 bytes."""
    fused = next(w for w in priced_inventory(STEPS / "adamw-fused.json.gz")[0] if w.label == "aten::_fused_adamw_")
    assert fused.category == "optimizer" and fused.bytes == PARAMS * 4 * 7 and fused.flops == 0
    foreach = _optimizer_bytes(STEPS / "adamw-foreach.json.gz")
    loop = _optimizer_bytes(STEPS / "adamw-for-loop.json.gz")
    assert foreach == pytest.approx(loop, rel=0.01) and foreach == pytest.approx(PARAMS * 4 * 21, rel=0.01)
    assert _optimizer_bytes(STEPS / "adamw-fused.json.gz") == pytest.approx(foreach / 3, rel=0.10)


def test_every_fused_optimizer_op_is_costed_from_its_tensor_lists():
    params = [[64, 32], [64]]
    adam = [params, params, params, params, [], [[], []]] + [[]] * 7  # params, grads, exp_avg(_sq), step counters
    sgd = [params, params, params] + [[]] * 6  # params, grads, momentum buffers
    assert ops.op_cost("aten::_fused_adam_", adam, ["TensorList"] * 6).bytes == (64 * 32 + 64) * 4 * 7
    assert ops.op_cost("aten::_fused_sgd_", sgd, ["TensorList"] * 3).bytes == (64 * 32 + 64) * 4 * 5
    assert ops.op_cost("aten::_fused_adamw_", [[], []], ["TensorList"] * 2) is None  # nothing recorded


def _unpriced_by_hand(path) -> set[str]:
    """The aten ops of the step that launch work and have no cost, and neither an op over them nor one
    under them with a cost: what the inventory can only leave out."""
    nodes = _cpu_nodes(json.loads(gzip.decompress(path.read_bytes())))
    start, end = _window(nodes)
    step = [n for n in nodes if start - 1e-3 <= n.start <= end + 1e-3]

    def costed(n):
        args = n.event.get("args") or {}
        return ops.is_costed(n.name) and ops.op_cost(n.name, args.get("Input Dims"), args.get("Input type"),
                                                     args.get("Concrete Inputs")) is not None

    def below(n):
        return any(costed(c) or below(c) for c in n.children)
    return {n.name for n in step if n.event.get("cat") == "cpu_op" and ops.is_costed(n.name) and not costed(n)
            and not below(n) and not any(costed(a) for a in n.ancestors())}


@pytest.mark.parametrize("path", REAL_STEPS, ids=lambda p: p.name)
def test_no_op_of_a_real_step_goes_unpriced_without_being_named(path):
    assert _unpriced_by_hand(path) == set(priced_inventory(path)[1])


def _fused_op_bytes(path) -> float:
    return sum(w.bytes for w in priced_inventory(path)[0] if "_fused_adamw_" in w.label)


def test_without_the_fused_rule_the_fused_step_is_still_priced_by_its_tensor_lists_bytes(monkeypatch):
    """Every op is priced: an op whose inputs are tensor lists (no FLOPs) by the bytes of its tensors; the
    fused rule prices the one pass (each state read and written once, the gradients read)."""
    one_pass = _fused_op_bytes(STEPS / "adamw-fused.json.gz")
    monkeypatch.setattr(ops, "FUSED_OPTIMIZERS", set())
    assert priced_inventory(STEPS / "adamw-fused.json.gz")[1] == {}
    assert 0 < _fused_op_bytes(STEPS / "adamw-fused.json.gz") != pytest.approx(one_pass, rel=0.05)


def test_the_output_names_ops_it_left_out(tmp_path):
    """An op the inventory cannot price (here an op whose tensors the trace did not record) is said under the
    tables, with the case, the mode and the count."""
    from amp_bench.analysis.predict.model import predict_cases
    from amp_bench.analysis.predict.settings import notes
    from amp_bench.analysis.predict.source import recorded_source
    events = json.loads(gzip.decompress((STEPS / "adamw-fused.json.gz").read_bytes()))
    step = next(e for e in events["traceEvents"] if e["name"] == "amp_bench::step")
    events["traceEvents"].append({"ph": "X", "cat": "cpu_op", "name": "aten::_fused_lamb_", "pid": step["pid"],
                                  "tid": step["tid"] + 1, "ts": step["ts"] + 1, "dur": 5,
                                  "args": {"Input Dims": [[], []], "Input type": ["TensorList"] * 2}})
    trace = tmp_path / "step.json.gz"
    with gzip.open(trace, "wt") as fh:
        json.dump(events, fh)
    source = recorded_source("mlp bs 32", {"model_label": "mlp", "batch_size": 32}, 32, {"fp32": (trace, {})}, {})
    result = predict_cases([source], ["h100-sxm"])
    text = " ".join(notes(result, ["h100-sxm"], None))
    assert "mlp bs 32 fp32: 1 op calls had no FLOPs or bytes" in text and "aten::_fused_lamb_ (1)" in text


def test_each_gpus_fractions_say_which_are_measured():
    """The H100's FP32 fraction is measured (NeuSight's microbenchmarks), its 16-bit and bandwidth ones are
    the assumed defaults; the H200's bf16 and bandwidth ones are this project's measurements."""
    specs = by_key()
    assert fractions(specs["h100-sxm"]) == (["fp32"], ["tf32", "fp16", "bf16", "fp8", "bandwidth"])
    assert fraction_label(specs["h100-sxm"]) == ("measured: fp32 0.77; assumed: tf32, fp16, bf16, fp8 0.80, "
                                                 "bandwidth 0.90")
    assert fractions(specs["h200"]) == (["bf16", "bandwidth"], ["fp32", "tf32", "fp16", "fp8"])
    assert fractions(specs["a100-80gb"])[0] == []


def test_the_notes_never_call_a_measured_fraction_unmeasured(capsys, monkeypatch):
    """The fractions scale a GPU profile: a GPU run's notes name the ones assumed."""
    monkeypatch.setenv("COLUMNS", "1000")  # a narrow COLUMNS left in the process would cut the notes column
    assert main(["predict", str(DATA / "gpu_run"), "--target", "h100-sxm,h200", "--source-gpu", "a100-40gb"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "H100 SXM 80GB (tf32, fp16, bf16, fp8, bandwidth)" in out and "H200 SXM 141GB (fp32, tf32, fp16, fp8)" in out
    assert "not measured for H200" not in out
    assert main(["predict", "--list-targets"]) == 0
    table = capsys.readouterr().out
    assert "measured: fp32 0.77" in table and "measured: bf16 0.80, bandwidth 0.90" in table


def test_neusight_extract_names_every_label_file_it_skips():
    names = [f"scripts/asplos/label/{gpu}/{workload}.csv" for gpu, workload in [
        ("NVIDIA_L4", "bert_large-train-512-2"), ("Tesla_P100-PCIE-16GB", "bert_large-train-512-2"),
        ("Tesla_P100-PCIE-16GB", "gpt2_large-inf-1024-1"), ("AMD_Instinct_MI250", "opt_13-train-2048-1"),
        ("NVIDIA_L4", "switchxl4-inf-512-1")]] + ["scripts/asplos/label/NVIDIA_L4/bert_large-train-512-2.json"]
    kept, skipped = neusight.select_labels(names)
    assert [k[1:] for k in kept] == [("NVIDIA_L4", "bert_large-train-512-2")]
    assert neusight.skipped_lines(skipped) == [
        "skipped (GPU not in the spec table): AMD_Instinct_MI250 (1 file), Tesla_P100-PCIE-16GB (2 files)",
        "skipped (model without a known layer span): switchxl4-inf-512-1 (1 file)"]
