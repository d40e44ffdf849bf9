"""The casts and fp8 rules: each fires where it applies and stays silent where it does not, on real evidence.
Casts: three real CPU steps of one MLP under bf16 autocast (tests/data/advice/casts/, benchmarks/advice_casts.yaml:
autocast's own casts alone, an fp32 island, a weight re-cast in a loop), the smoke run's ResNet-18 (autocast's
casts alone) and the H200 GPT-2's kernel table (casts at 10% of its step, no op tree to tell whose). fp8: the
H200 GPT-2's kernel table with the layers its config gives, and the same step priced where it must stay silent."""
import gzip
import json
import shutil
from pathlib import Path

import pytest
from test_advice import h200_gpt2

from amp_bench.analysis.advice import assess, from_row, intrinsic
from amp_bench.analysis.advice.rules import FP8_ANCHORS, casts, fp8, fp8_gain
from amp_bench.analysis.explain.alignment import Layer

CASTS = Path(__file__).parent / "data" / "advice" / "casts"
CPU_RUN = Path(__file__).parent / "data" / "predict" / "cpu_run"


def casts_case(tmp_path, label: str, **row_changes):
    stem = f"{label}-bs32-amp_bf16-r0"
    row = json.loads((CASTS / f"{stem}.row.json").read_text()) | row_changes
    traces = tmp_path / "traces"
    traces.mkdir(exist_ok=True)
    for suffix in (".json.gz", ".layers.json"):
        shutil.copy(CASTS / f"{stem}{suffix}", traces / f"{stem}{suffix}")
    return from_row(row, tmp_path)


def test_autocasts_own_casts_are_never_advice(tmp_path):
    """Each weight once per region and the inputs autocast casts for its ops, forward and back: all of them
    sit inside the op autocast wraps, so the rule says nothing; a step they weigh on gets the by-design note."""
    evidence = casts_case(tmp_path, "mlp-autocast")
    assert evidence.casts.casts and not any(c.explicit for c in evidence.casts.casts)
    assert casts(evidence) is None
    evidence.profiled_ms = evidence.step_ms = sum(c.ms for c in evidence.casts.casts) / evidence.casts.steps * 20
    (note,) = [n for n in intrinsic(evidence) if "autocast's own casts" in n]
    assert "price for fp32 master weights: not advice" in note


def test_the_smoke_runs_resnet18_under_autocast_has_no_avoidable_cast():
    from amp_bench.analysis.advice.casts import read_casts
    reading = read_casts(CPU_RUN / "traces" / "resnet18-bs4-32px-amp_bf16-r0.json.gz")
    assert reading is not None and len(reading.casts) > 20 and not any(c.explicit for c in reading.casts)
    row = {"explain_status": "ok", "explain_profiled_ms": 10.0, "precision": "amp_bf16", "device": "cpu"}
    evidence = from_row(row, None)
    evidence.casts = reading
    assert casts(evidence) is None


def test_an_fp32_island_is_found_and_priced_with_its_gradients_casts(tmp_path):
    """Four blocks whose norm and GELU run in fp32 between autocast regions: each casts its activations up
    (the model's `.float()`) and back down (autocast, at the next linear), and the backward casts both
    gradients back. On this CPU bf16 runs emulated, so the islands' ops would be slower in bf16: uncertain."""
    evidence = casts_case(tmp_path, "mlp-island")
    item = casts(evidence)
    assert item is not None and item.rule == "casts" and item.variant is None  # no case field undoes a model's code
    assert item.evidence.startswith("4 fp32 island(s) a step") and "keep the fp32 islands' activations" in item.change
    assert item.verdict == "uncertain" and "bf16 runs emulated" in item.reason()
    up = [c for c in evidence.casts.casts if c.explicit and c.up and c.step == 0]
    assert len(up) == 4 and all(c.shape == up[0].shape for c in up)  # the model's own four
    native = casts(casts_case(tmp_path, "mlp-island", emulated=False))
    assert not native.doubt and native.predicted_ms == pytest.approx(item.predicted_ms)


def test_a_weight_recast_in_a_loop_is_counted_against_the_layers_that_hold_it(tmp_path):
    """The first block's 512x512 linear applied 16 times in a region with the weight cache off: 20 casts a step
    for the 4 weights of that shape the layers hold, 16 of them avoidable: 8% of a step whose emulated bf16
    GEMMs dwarf any cast on this CPU, so inside the noise floor (uncertain); a step whose GEMMs took a tenth of
    the time (bf16 units) would make it advice."""
    evidence = casts_case(tmp_path, "mlp-loop")
    item = casts(evidence)
    assert item is not None and "512x512 20x for 4 weight(s)" in item.evidence and item.doubt == ""
    assert item.change.startswith("cast each weight once a step") and item.verdict == "uncertain"
    forward = [c for c in evidence.casts.casts if c.shape == (512, 512) and c.down and not c.backward]
    backward = [c for c in evidence.casts.casts if c.shape == (512, 512) and c.backward]
    each = sum(c.ms for c in forward) / len(forward) + sum(c.ms for c in backward) / len(backward)
    assert item.predicted_ms == pytest.approx(evidence.step_ms - evidence.measured(16 * each))
    gemm, ratio = evidence.categories_ms["gemm"] * 0.9, evidence.step_ms / evidence.profiled_ms
    evidence.profiled_ms, evidence.step_ms = evidence.profiled_ms - gemm, evidence.step_ms - gemm * ratio
    assert casts(evidence).verdict == "advice"
    evidence.layers = []
    assert casts(evidence) is None  # without the layers, twelve weights cast once look like one cast twelve times


def test_a_gpu_kernel_table_alone_says_nothing_of_whose_casts_they_are():
    gpt2 = h200_gpt2()
    assert gpt2.categories_ms["cast"] / gpt2.profiled_ms > 0.09 and gpt2.casts is None
    assert casts(gpt2) is None


# --------------------------------------------------------------------------- fp8

def gpt2_layers(vocab: int = 50257, rows: int = 256 * 128, blocks: int = 2) -> list[Layer]:
    """The GPT-2 small linears (transformers' Conv1D, read as Linear) of the H200 explain case: 2 blocks."""
    layers = []
    for b in range(blocks):
        for name, k, n in (("attn.c_attn", 768, 2304), ("attn.c_proj", 768, 768), ("mlp.c_fc", 768, 3072),
                           ("mlp.c_proj", 3072, 768)):
            layers.append(Layer(f"transformer.h.{b}.{name}", "Linear", {"in": k, "out": n, "rows": rows}))
    return layers + [Layer("lm_head", "Linear", {"in": 768, "out": vocab, "rows": rows})]


def test_fp8_gain_follows_torchaos_anchors_and_holds_outside_them():
    (small, low), (large, high) = FP8_ANCHORS
    assert fp8_gain(1024, 2048, 1024) == pytest.approx(low) and fp8_gain(4096, 8192, 16384) == pytest.approx(high)
    assert fp8_gain(16, 16, 16) == pytest.approx(low) and fp8_gain(65536, 65536, 65536) == pytest.approx(high)
    middle = fp8_gain(2048, 4096, 4096)
    assert low < middle < high
    assert fp8_gain(2048, 4096, 8192) > middle  # more work per GEMM, more of float8's gain


def test_fp8_on_the_h200_gpt2_converts_the_aligned_linears_only_and_stays_quiet_at_their_small_share():
    """As profiled, lm_head (50257, not a multiple of 16) stays bf16 and holds 61 of the 65 ms of GEMMs on its
    align1 kernels; float8 would convert the eight block linears, about 4% of the step, gaining ~15% of that:
    under the 2% an item needs."""
    gpt2 = h200_gpt2()
    gpt2.layers = gpt2_layers()
    assert fp8(gpt2) is None


def padded_gpt2(compile_mode: str):
    """The same H200 step with the vocabulary padded to 50304, as pad_dims prices it: lm_head's GEMMs at the
    aligned GEMMs' efficiency instead of on align1 kernels."""
    gpt2 = h200_gpt2()
    (pad,) = [item for item in assess(gpt2) if item.rule == "pad_dims"]
    gpt2.kernels_ms = {name: ms for name, ms in gpt2.kernels_ms.items() if "align1" not in name}
    saved = gpt2.profiled_ms - gpt2.profiled_ms * pad.predicted_ms / pad.step_ms
    gpt2.categories_ms["gemm"] -= saved
    gpt2.profiled_ms -= saved
    gpt2.step_ms = pad.predicted_ms
    gpt2.layers = gpt2_layers(vocab=50304)
    gpt2.case["compile_mode"] = compile_mode
    return gpt2


def test_fp8_fires_on_the_padded_h200_gpt2_compiled_and_is_uncertain_eager():
    compiled = fp8(padded_gpt2("default"))
    assert compiled is not None and compiled.rule == "fp8" and compiled.variant == {"precision": "fp8"}
    assert compiled.evidence.startswith("9 of 9 linear layers would train in float8")
    assert compiled.speedup > 1 and not compiled.doubt
    eager = fp8(padded_gpt2("eager"))
    assert eager.verdict == "uncertain" and "float8 is fast only compiled" in eager.reason() and eager.variant is None
    assert eager.predicted_ms == pytest.approx(compiled.predicted_ms)


@pytest.mark.parametrize("change", [{"device_type": "cpu"}, {"device_name": "NVIDIA A100-SXM4-80GB"},
                                    {"precision": "amp_fp16"}, {"layers": []}])
def test_fp8_stays_silent_without_fp8_units_a_bf16_step_or_layer_shapes(change):
    gpt2 = padded_gpt2("default")
    for key, value in change.items():
        setattr(gpt2, key, value)
    assert fp8(gpt2) is None


def test_small_gemms_make_fp8_a_predicted_loss_never_a_gain():
    """The H200 case's shapes at one sequence of 128 tokens: the block linears' GEMMs are below torchao's first
    anchor (0.8x) and lm_head's near it, so float8 loses."""
    gpt2 = padded_gpt2("default")
    gpt2.layers = gpt2_layers(vocab=50304, rows=128)
    item = fp8(gpt2)
    assert item.verdict == "slower" and item.line().startswith("not advised: train the linear layers in fp8")


def test_a_trace_alone_reads_its_casts(tmp_path):
    """explain --trace: the island trace read without its row still shows the model's own casts."""
    from amp_bench.analysis.advice.evidence import from_profile
    from amp_bench.analysis.explain.trace import read_profile
    trace = tmp_path / "island.json.gz"
    shutil.copy(CASTS / "mlp-island-bs32-amp_bf16-r0.json.gz", trace)
    evidence = from_profile(read_profile(trace, None, str(trace)), "amp_bf16")
    assert evidence.casts is not None and any(c.explicit and c.up for c in evidence.casts.casts)
    item = casts(evidence)
    assert item is not None and item.verdict == "uncertain"  # a CPU trace alone: bf16's speed there is unknown
    with gzip.open(trace) as fh:
        assert json.load(fh)["traceEvents"]
