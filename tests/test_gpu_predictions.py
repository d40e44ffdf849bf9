"""What a suite's GPU cases would give, from any machine: each mode's step recorded on fake tensors under
CUDA's autocast policy (measure/fake_step.py), cached (store/inventories.py), priced by the fitted model
(analysis/predict/pricing.py), said where the hardware cannot measure (`predict SUITE`, a run's end, the
report), and never read as a measurement."""
import dataclasses
import gzip
import json
from collections import Counter
from pathlib import Path

import pytest

from amp_bench.analysis.predict import fitted, pricing
from amp_bench.analysis.predict.inventory import priced_inventory
from amp_bench.analysis.predict.scaling import Work
from amp_bench.cli import main
from amp_bench.platform.gpu_specs import by_key
from amp_bench.store import inventories
from amp_bench.studies import gpu_predictions
from amp_bench.suite import load_suite

SPEC = by_key()
DATA = Path(__file__).resolve().parent / "data" / "predict"


@pytest.fixture(autouse=True)
def wide_console(monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")


def _case(write_suite, text: str, precision: str):
    return next(c for c in load_suite(write_suite(text)).cases("cuda") if c.precision == precision)


CNN = "models: [torchvision/resnet18]\nimage_size: 32\nbatch_sizes: [4]\nprecisions: [fp32, amp_fp16, amp_bf16]\n"
GPT2 = ("models:\n  - ref: transformers/gpt2\n    config: {n_layer: 1, n_embd: 64, n_head: 2, vocab_size: 1000, "
        "n_positions: 64}\n    attn_implementation: sdpa\nseq_len: 16\nbatch_sizes: [2]\n"
        "precisions: [fp32, amp_fp16, amp_bf16, fp8]\noptimizer: {name: adamw, impl: fused}\n")
MLP = "models: ['python:toy_models:mlp']\nbatch_sizes: [8]\nprecisions: [fp32, amp_fp16, amp_bf16]\n"


def _ops(trace: dict) -> list[dict]:
    return [e for e in trace["traceEvents"] if e.get("cat") == "cpu_op"]


def _types(trace: dict, name: str) -> list[list[str]]:
    return [e["args"]["Input type"] for e in _ops(trace) if e["name"] == name]


# --------------------------------------------------------------------------- the recorder, every kind of model

@pytest.mark.parametrize("suite", [CNN, GPT2, MLP], ids=["torchvision", "transformers", "python"])
def test_every_mode_of_every_kind_of_model_is_recorded_as_cuda_runs_it(write_suite, suite):
    from amp_bench.measure.fake_step import record_case
    recorded = {}
    for case in load_suite(write_suite(suite)).cases("cuda"):
        trace, memory, details = record_case(case)
        names = Counter(e["name"] for e in _ops(trace))
        assert names and memory["peak"] >= memory["weights"] + memory["forward_kept"] > 0
        assert priced_inventory_of(trace)[1] == {}  # every op of the step priced
        recorded[case.precision] = (trace, memory, names)
    fp32, fp16, bf16 = (recorded[m] for m in ("fp32", "amp_fp16", "amp_bf16"))
    gemm = "aten::convolution" if "aten::convolution" in fp32[2] else ("aten::addmm" if "aten::addmm" in fp32[2]
                                                                       else "aten::mm")
    assert all(t[0] == "float" for t in _types(fp32[0], gemm))
    assert any("c10::Half" in t for t in _types(fp16[0], gemm))
    assert any("c10::BFloat16" in t for t in _types(bf16[0], gemm))
    assert fp16[2]["aten::_amp_foreach_non_finite_check_and_unscale_"] == 1 and not bf16[2]["aten::_amp_update_scale_"]
    if "fp8" in recorded:  # torchao's float8 linears trace on fake tensors: their GEMMs read float8 data
        assert any("c10::Float8_e4m3fn" in t for name in ("aten::mm", "aten::_scaled_mm")
                   for t in _types(recorded["fp8"][0], name))


def priced_inventory_of(trace: dict):
    import tempfile
    with tempfile.NamedTemporaryFile(suffix=".json.gz") as handle:
        with gzip.open(handle.name, "wt") as fh:
            json.dump(trace, fh)
        return priced_inventory(handle.name)


def test_cuda_autocast_policy_runs_layer_norm_and_softmax_in_fp32_and_attention_as_one_op(write_suite):
    from amp_bench.measure.fake_step import record_case
    trace, _, _ = record_case(_case(write_suite, GPT2, "amp_bf16"))
    assert all(t[0] == "float" for t in _types(trace, "aten::native_layer_norm"))  # CPU autocast would keep bf16
    assert _types(trace, "aten::_scaled_dot_product_flash_attention_for_cpu")  # fused, as CUDA's flash kernels
    assert not _types(trace, "aten::_safe_softmax")  # not SDPA's math path


def test_amp_keeps_16_bit_activations_and_its_weight_copies_for_backward(write_suite):
    """Where activations dominate (ResNet-18 at 128 px, batch 32), bf16 keeps less for backward than fp32; where
    weights do (the same at 32 px, batch 4), the bf16 weight copies autocast keeps make it more (#61173)."""
    from amp_bench.measure.fake_step import record_case
    kept = {}
    for text in (CNN.replace("image_size: 32", "image_size: 128").replace("[4]", "[32]"), CNN):
        for precision in ("fp32", "amp_bf16"):
            kept[(text is CNN, precision)] = record_case(_case(write_suite, text, precision))[1]["forward_kept"]
    assert kept[(False, "amp_bf16")] < kept[(False, "fp32")] and kept[(True, "amp_bf16")] > kept[(True, "fp32")]


def test_the_memory_record_counts_weights_gradients_and_optimizer_state_exactly(write_suite):
    """A 16-32-4 MLP under fused AdamW: every tensor rounded up to the allocator's 512 bytes."""
    from amp_bench.measure.fake_step import record_case
    case = dataclasses.replace(_case(write_suite, MLP, "fp32"), optimizer=dataclasses.replace(
        _case(write_suite, MLP, "fp32").optimizer, name="adamw", impl="fused"))
    _, memory, details = record_case(case)
    tensors = [16 * 32, 32, 32 * 4, 4]
    blocks = sum(-(-4 * n // 512) * 512 for n in tensors)
    assert memory["weights"] == memory["gradients"] == blocks and details["model_parameters"] == sum(tensors)
    assert memory["optimizer_state"] == 2 * blocks + 4 * 512  # exp_avg, exp_avg_sq, and a 0-d step per tensor


# --------------------------------------------------------------------------- the cache

def test_the_cache_key_follows_what_decides_the_recorded_step(write_suite, monkeypatch):
    cases = {c.precision: c.to_json() for c in load_suite(write_suite(CNN.replace(
        "[fp32, amp_fp16, amp_bf16]", "[fp32, tf32, amp_fp16, amp_bf16]"))).cases("cuda")}
    key = inventories.key
    assert key(cases["fp32"]) == key(cases["tf32"])  # the same ops; only the math differs on the target
    assert len({key(cases[m]) for m in ("fp32", "amp_fp16", "amp_bf16")}) == 3
    assert key({**cases["fp32"], "batch_size": 8}) != key(cases["fp32"])
    assert key({**cases["fp32"], "repeats": 9, "steps": 3}) == key(cases["fp32"])  # how long it is measured: no
    before = key(cases["fp32"])
    monkeypatch.setattr(inventories, "torch_version", lambda: "9.9.9")  # another torch records other ops
    assert key(cases["fp32"]) != before


def test_a_suite_is_recorded_once_then_predicted_from_the_cache(write_suite, monkeypatch, capsys):
    suite = write_suite(MLP)
    assert main(["predict", str(suite)]) == 0
    first = capsys.readouterr().out
    assert all(label in first for label in ("V100 SXM2", "A100 SXM 80GB", "L4", "H100 SXM 80GB"))  # the defaults
    assert "Predicted, nothing measured on a GPU" in first

    def no_worker(*args, **kwargs):
        raise AssertionError("a cached suite started a worker")
    monkeypatch.setattr("amp_bench.launchers.forkserver.launch", no_worker)
    assert main(["predict", str(suite), "--target", "a100-80gb"]) == 0
    assert "A100 SXM 80GB" in capsys.readouterr().out


def test_a_model_that_cannot_be_recorded_is_named_and_the_others_are_predicted(write_suite):
    suite = write_suite("models: ['python:toy_models:mlp', 'python:toy_models:raises']\nbatch_sizes: [4]\n"
                        "precisions: [fp32, amp_bf16]\n")
    table = gpu_predictions.predict_suite(suite, ["a100-80gb"]).table
    broken = table[table["case"].str.contains("raises")]
    assert (broken["status"] == "no prediction").all()
    assert broken["reason"].str.contains("could not be recorded on fake tensors: ValueError: this model is").all()
    assert (table.loc[~table["case"].str.contains("raises"), "status"] == "ok").all()


def test_a_cpu_run_is_predicted_from_its_suites_gpu_block_not_its_cpu_block(write_suite, tmp_path):
    suite = write_suite(MLP + "cuda:\n  batch_sizes: [64]\ncpu:\n  batch_sizes: [2]\n")
    cases = gpu_predictions.gpu_cases(suite)
    assert {c.batch_size for c in cases} == {64}
    result = gpu_predictions.predict_suite(suite, ["h100-sxm"])
    assert result.table["case"].str.contains("bs 64").all()


# --------------------------------------------------------------------------- the pricing

def _ops_of(*works) -> pricing.Ops:
    return pricing.Ops.of(list(works))


def test_a_misaligned_gemm_costs_more_than_an_aligned_one_of_the_same_flops():
    aligned = Work("mm", "gemm", None, flops=2 * 4096.0 ** 3, bytes=3 * 4096 ** 2 * 2, math="bf16")
    odd = dataclasses.replace(aligned, misaligned=True)
    p = {**fitted.PARAMETERS, "misaligned": 0.2}
    assert pricing.op_ms(_ops_of(odd), SPEC["h100-sxm"], (False, False), p).sum() > \
        pricing.op_ms(_ops_of(aligned), SPEC["h100-sxm"], (False, False), p).sum()


def test_an_nchw_tensor_core_convolution_pays_its_transforms_and_fp32_simt_does_not():
    conv = Work("conv", "conv", None, flops=1e11, bytes=1e8, math="fp16", nchw_bytes=4e8)
    fp32 = dataclasses.replace(conv, math="fp32")
    p, h100 = {**fitted.PARAMETERS, "nchw_16bit": 1.0, "nchw_tf32": 1.0}, SPEC["h100-sxm"]
    with_transforms = pricing.op_ms(_ops_of(conv), h100, (False, False), p).sum()
    without = pricing.op_ms(_ops_of(dataclasses.replace(conv, nchw_bytes=0.0)), h100, (False, False), p).sum()
    assert with_transforms - without == pytest.approx(4e8 / (h100.bandwidth_gbs * 1e9 *
                                                             pricing.chip_fraction(h100, "bandwidth")) * 1e3)
    assert pricing.op_ms(_ops_of(fp32), h100, (False, False), p).sum() == \
        pricing.op_ms(_ops_of(dataclasses.replace(fp32, nchw_bytes=0.0)), h100, (False, False), p).sum()


def test_every_fitted_parameter_is_named_documented_and_inside_its_range():
    assert set(fitted.PARAMETERS) == set(pricing.PARAMETERS)
    for name, value in fitted.PARAMETERS.items():
        prior, (low, high), what = pricing.PARAMETERS[name]
        assert low <= value <= high and what
    for kind in ("speedup", "throughput"):
        low, high = fitted.INTERVALS[kind]
        assert low < 1 < high


def test_predictions_carry_intervals_memory_and_the_saving(write_suite):
    table = gpu_predictions.predict_suite(write_suite(CNN), ["a100-80gb", "v100-sxm2"]).table
    ok = table[table["status"] == "ok"]
    assert ((ok["step_ms_low"] < ok["step_ms"]) & (ok["step_ms"] < ok["step_ms_high"])).all()
    amp = ok[ok["precision"] != "fp32"]
    assert ((amp["speedup_low"] < amp["speedup"]) & (amp["speedup"] < amp["speedup_high"])).all()
    assert (amp["memory_saving"] > 0).all() and (ok["peak_memory_bytes"] > 0).all()
    v100 = table[table["target"] == "v100-sxm2"].set_index("precision")
    assert v100.loc["amp_bf16", "status"] == "unsupported"


# --------------------------------------------------------------------------- never a measurement

def test_a_prediction_never_enters_compare_nightly_or_an_export(tmp_path, capsys):
    """A run made without a GPU keeps what it predicted in predicted.csv; compare, nightly and the exports
    read its measured rows only, and the GPUs-compared table marks the predicted rows as such."""
    import shutil

    from amp_bench.analysis.exports import otava_tables, to_bmf
    from amp_bench.analysis.gpus import PREDICTED, compare_gpus, with_predictions
    from amp_bench.analysis.speedups import summarize
    from amp_bench.store.results import load_results, read_table
    run = tmp_path / "results" / "run"
    shutil.copytree(DATA / "cpu_run", run)
    assert gpu_predictions.after_cpu_run(run) is not None and (run / "predicted.csv").is_file()
    capsys.readouterr()
    for argv in (["compare", str(run), str(run)], ["nightly", str(tmp_path / "results")]):
        main(argv)
        assert "H100" not in capsys.readouterr().out
    assert "H100" not in json.dumps(to_bmf(run)) + str(otava_tables(run))
    results = load_results(run)
    gpus = with_predictions(compare_gpus(summarize(results), results), read_table([run], "predicted"))
    marked = gpus["predicted"].astype(bool)
    assert marked.any() and gpus.loc[marked, "gpu"].str.endswith(PREDICTED).all()
    assert not gpus.loc[~marked, "gpu"].str.contains("H100").any()
