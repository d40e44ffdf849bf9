"""Advice: each rule fires where its evidence is, stays silent where it is not, and prices its change from the
same step's own figures, on real readings: the first H200 reading's GPT-2 explain case (its row and its 20
longest kernels, docs/gpu-validation/2026-12-04-h200-5436a8a/), the CPU main job's ResNet-50 (its row, its
layers and oneDNN's verbose step, tests/data/advice/: 2-core AMD EPYC, AVX512-BF16, 2026-12-04) and two CPU
cases with the shape probe's readings (tests/data/advice/probe/: 2-core AMD EPYC, AVX2 only, 2026-12-06)."""
import gzip
import json
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest

from amp_bench.analysis.advice import advise, assess, from_row, intrinsic
from amp_bench.analysis.advice.rules import FUSED_SHARE, IN_STEP_KINDS, NOISE_SHARE
from conftest import ROOT

H200 = ROOT / "docs" / "gpu-validation" / "2026-12-04-h200-5436a8a"
ADVICE = Path(__file__).parent / "data" / "advice"


def h200_gpt2():
    """The H200 GPT-2 (2 layers, bs 256, seq 128, amp_bf16) row with its kernel table: ms per step."""
    suite = pd.read_csv(H200 / "part2_suite.csv")
    row = suite[suite["model_label"] == "gpt2-explain"].iloc[0].to_dict()
    evidence = from_row(row, None)
    steps = int(row["explain_profiled_steps"])
    summary = (H200 / "part2_summary.md").read_text()
    table = summary[summary.index("The 20 longest kernels"):]
    for name, _, _, total in re.findall(r"^\| (.+?) \| (\w+) \| (\d+) \| ([\d.]+) \|$", table, re.M):
        evidence.kernels_ms[name] = float(total) / steps
    return evidence


def resnet50_cpu(tmp_path, precision="amp_bf16"):
    stem = f"resnet50-bs8-224px-{precision}-r0"
    row = json.loads((ADVICE / f"{stem}.row.json").read_text())
    traces = tmp_path / "traces"
    traces.mkdir(exist_ok=True)
    shutil.copy(ADVICE / f"{stem}.layers.json", traces / f"{stem}.layers.json")
    with gzip.open(ADVICE / f"{stem}.onednn.txt.gz") as src:
        (traces / f"{stem}.onednn.txt").write_bytes(src.read())
    return from_row(row, tmp_path)


def test_gpt2s_misaligned_vocabulary_on_an_h200_is_priced_at_its_aligned_gemms_efficiency():
    evidence = h200_gpt2()
    (pad,) = advise(evidence)  # no convolution, a fused AdamW, 3% idle: the one item
    assert pad.rule == "pad_dims" and pad.change == "pad the vocabulary to a multiple of 64 (50257 -> 50304)"
    assert pad.variant == {"pad_vocab_to_multiple_of": 64}
    assert "lm_head Linear(768 -> 50257) holds 72% of the GEMM FLOPs" in pad.evidence
    assert "3 misaligned-kernel GEMMs took 60.8 ms of the 106.2 ms step (57%)" in pad.evidence
    assert "align1" in pad.evidence
    # 72.5% of the FLOPs at the 3.8 ms the aligned 27.5% took: ~10.1 ms instead of 60.8 ms
    assert pad.predicted_ms == pytest.approx(103.36 - (60.75 - 0.725 / 0.275 * 3.83) * 103.36 / 106.17, rel=0.01)
    assert pad.low_ms < pad.predicted_ms < pad.high_ms < pad.step_ms
    assert 1.8 < pad.speedup < 2.0
    (softmax,) = intrinsic(evidence)
    assert "runs in fp32 under autocast by design" in softmax and "not advice" in softmax


def probed_cpu(tmp_path, label="mobilenet_v3_small"):
    """A real fp32 CPU case whose worker left the shape probe's readings beside its trace."""
    stem = f"{label}-bs16-128px-fp32-r0"
    row = json.loads((ADVICE / "probe" / f"{stem}.row.json").read_text())
    traces = tmp_path / "traces"
    traces.mkdir(exist_ok=True)
    for suffix in (".layers.json", ".probe.json"):
        shutil.copy(ADVICE / "probe" / f"{stem}{suffix}", traces / f"{stem}{suffix}")
    with gzip.open(ADVICE / "probe" / f"{stem}.onednn.txt.gz") as src:
        (traces / f"{stem}.onednn.txt").write_bytes(src.read())
    return row, traces / f"{stem}.probe.json"


def test_resnet50_nchw_without_a_probe_is_channels_last_uncertain_its_cost_unmeasured(tmp_path):
    """The main job's ResNet-50 predates the shape probe: oneDNN's reorders price what NHWC removes, nothing
    prices what it costs, so the item is listed as uncertain and is never advice."""
    evidence = resnet50_cpu(tmp_path)
    (layout,) = assess(evidence)  # aligned or not, a CPU's kernels do not say alignment cost anything
    assert layout.rule == "channels_last" and layout.variant == {"channels_last": True}
    assert "oneDNN reordered activations between NCHW and its blocked layout for 106 ms" in layout.evidence
    assert layout.low_ms < layout.predicted_ms < layout.step_ms
    assert layout.verdict == "uncertain" and "what NHWC costs is unmeasured: no shape probe" in layout.reason()
    assert layout.line().startswith("uncertain (what NHWC costs is unmeasured")
    assert advise(evidence) == [] and intrinsic(evidence) == []


def test_channels_last_prices_both_sides_from_the_shape_probe(tmp_path):
    """mobilenet_v3_small's 92 distinct 4-D layers timed in NCHW and in NHWC by its worker: the change is their
    difference, scaled to the step by what its convolutions and norms took in the profile over the probe."""
    from amp_bench.analysis.advice.probe import read_probe
    row, probe = probed_cpu(tmp_path)
    evidence = from_row(row, tmp_path)
    reading = read_probe(probe).changes["channels_last"]
    layout = next(item for item in assess(evidence) if item.rule == "channels_last")
    scale = sum(evidence.categories_ms[k] for k in IN_STEP_KINDS) / reading.priced(IN_STEP_KINDS)[0]
    saving = scale * (reading.priced()[0] - reading.priced()[1])
    assert layout.predicted_ms == pytest.approx(evidence.step_ms - evidence.measured(saving))
    assert f"timed all {len(reading.shapes)} shapes of its 4-D layers" in layout.evidence
    assert layout.low_ms < layout.predicted_ms < layout.high_ms and not layout.doubt


def test_a_probe_that_times_nhwc_slower_is_never_advised_as_a_gain(tmp_path):
    """The same case with its convolutions timed 60% slower in NHWC (as a CNN whose channel counts fit oneDNN's
    blocked layout better): the item is expected slower, said as such, and is not advice."""
    from amp_bench.analysis.advice.for_run import advice_lines
    row, probe = probed_cpu(tmp_path)
    readings = json.loads(probe.read_text())
    for shape in readings["changes"]["channels_last"]["shapes"]:
        shape["changed_ms"] = shape["now_ms"] * (1.6 if shape["kind"] == "conv" else 1.0)
    probe.write_text(json.dumps(readings))
    layout = next(item for item in assess(from_row(row, tmp_path)) if item.rule == "channels_last")
    assert layout.verdict == "slower" and layout.speedup < 1 and layout.reason() == "expected slower here"
    assert layout.line().startswith("not advised: train in channels_last (model and batch in torch.channels_last) "
                                    "would be slower here")
    assert "channels_last" not in [item.rule for item in advise(from_row(row, tmp_path))]
    row.update(run_id=tmp_path.name, repeat=0, status="ok")
    lines = advice_lines(pd.DataFrame([row]), tmp_path)
    said = [line for line in lines if "channels_last" in line]
    assert len(said) == 1 and ": not advised: " in said[0] and ". train in channels_last" not in said[0]


def test_a_probe_whose_budget_timed_none_of_a_changes_shapes_says_so(tmp_path):
    """AlexNet's 61M-parameter optimizer update spent the whole budget before any layer shape: the item falls
    back to the reorders, uncertain, and says why."""
    row, probe = probed_cpu(tmp_path)
    readings = json.loads(probe.read_text())
    change = readings["changes"]["channels_last"]
    change["untimed"], change["shapes"] = change["shapes"], []
    probe.write_text(json.dumps(readings))
    layout = next(item for item in assess(from_row(row, tmp_path)) if item.rule == "channels_last")
    assert layout.verdict == "uncertain"
    assert f"budget ({readings['budget_s']:.1f} s) ran out before it timed any of its 92 shapes" in layout.reason()


def test_an_unreadable_probe_names_its_file_and_field_and_the_item_says_so(tmp_path):
    from amp_bench.analysis.advice.probe import read_probe
    from amp_bench.errors import UserError
    row, probe = probed_cpu(tmp_path)
    readings = json.loads(probe.read_text())
    readings["changes"]["channels_last"]["shapes"][0]["calls"] = "many"
    probe.write_text(json.dumps(readings))
    with pytest.raises(UserError) as error:
        read_probe(probe)
    message = str(error.value)
    assert "\n" not in message and str(probe) in message and "field 'calls'" in message
    layout = next(item for item in assess(from_row(row, tmp_path)) if item.rule == "channels_last")
    assert layout.verdict == "uncertain" and str(probe) in layout.reason()  # priced from the reorders alone


def test_rules_stay_silent_where_their_evidence_is_not(tmp_path):
    evidence = resnet50_cpu(tmp_path)
    evidence.case["channels_last"] = True
    assert advise(evidence) == []  # already channels_last
    gpt2 = h200_gpt2()
    gpt2.device_type = "cpu"
    assert advise(gpt2) == []  # the same kernels on a CPU say nothing about alignment
    gpt2 = h200_gpt2()
    gpt2.kernels_ms = {k: v for k, v in gpt2.kernels_ms.items() if "align1" not in k}
    assert advise(gpt2) == []  # misaligned layers, but their GEMMs ran on the aligned path


def test_the_optimizer_rule_prices_the_fused_pass_and_the_host_rule_a_doubled_batch(tmp_path):
    evidence = resnet50_cpu(tmp_path)
    evidence.case.update(channels_last=True, optimizer="adamw", optimizer_impl="foreach")
    evidence.categories_ms["optimizer"] = 400.0  # an AdamW step of a larger share; no probe: priced by bytes
    (fused,) = advise(evidence)
    assert fused.rule == "optimizer_impl" and fused.variant == {"optimizer_impl": "fused"}
    saving = 400.0 * (1 - FUSED_SHARE["adamw"]) * evidence.step_ms / evidence.profiled_ms
    assert fused.predicted_ms == pytest.approx(evidence.step_ms - saving)
    evidence.case["optimizer_impl"] = "fused"
    assert advise(evidence) == []
    evidence.host_ms = 0.5 * evidence.profiled_ms  # half the step between ops
    (host,) = advise(evidence)
    busy = evidence.profiled_ms - evidence.host_ms
    assert host.rule == "host_bound" and host.variant == {"batch_size": 16} and "(8 -> 16)" in host.change
    per_sample = (2 * busy + evidence.host_ms) / 2
    assert host.predicted_ms == pytest.approx(evidence.measured(per_sample))
    # the interval: the ops' time from fixed per call (1.0x at twice the batch) to 2.2x, and the noise floor
    fixed, spilled = (busy + evidence.host_ms) / 2, (2.2 * busy + evidence.host_ms) / 2
    noise = NOISE_SHARE * evidence.profiled_ms
    assert (host.low_ms, host.high_ms) == pytest.approx((evidence.measured(fixed - noise),
                                                         evidence.measured(spilled + noise)))


def test_a_runs_advice_is_ranked_per_case_with_how_to_try_each_and_in_the_report(tmp_path):
    from amp_bench.analysis.advice.for_run import advice_lines
    from amp_bench.report.explain_section import advice_display
    resnet50_cpu(tmp_path)  # the saved files, under tmp_path/traces
    row = json.loads((ADVICE / "resnet50-bs8-224px-amp_bf16-r0.row.json").read_text())
    row.update(run_id=tmp_path.name, repeat=0, model_label="resnet50", image_size=224)
    results = pd.DataFrame([row])
    (line,) = advice_lines(results, tmp_path)  # no probe beside it: uncertain, below any advice, not numbered
    assert line.startswith("resnet50 bs 8 224px amp_bf16: uncertain (what NHWC costs is unmeasured")
    assert f"(`run --try channels_last {tmp_path}` measures it)" in line
    shown = advice_display(results, [tmp_path])
    assert list(shown["rule"]) == ["channels_last"] and shown["change"].iloc[0].startswith("uncertain (")
    assert shown["speedup"].iloc[0].startswith("1.1")


def test_a_runs_advice_starts_from_the_cases_median_not_its_profiled_repeat(tmp_path):
    """The profiled repeat ran on a slow stretch of the VM (1.6x its other repeats, as r0 of a main job did):
    the expected step starts from the median the table prints, the speedup is the profile's either way."""
    from amp_bench.analysis.advice.for_run import run_advice
    resnet50_cpu(tmp_path)
    row = json.loads((ADVICE / "resnet50-bs8-224px-amp_bf16-r0.row.json").read_text())
    row.update(run_id=tmp_path.name, repeat=0, model_label="resnet50", image_size=224)
    alone = run_advice(pd.DataFrame([row]), [tmp_path])[0][1]  # (uncertain: the step is what is checked here)
    others = [{**row, "repeat": r, "step_time_ms_median": row["step_time_ms_median"] / 1.6} for r in (1, 2)]
    (_, item), *_ = run_advice(pd.DataFrame([row, *others]), [tmp_path])
    assert item.step_ms == pytest.approx(row["step_time_ms_median"] / 1.6)
    assert item.speedup == pytest.approx(alone.speedup)
    assert f"from {item.step_ms:.4g}" in item.line()


PREDICT = ROOT / "tests" / "data" / "predict"


@pytest.mark.parametrize("trace, said", [("adamw-for-loop", ("adamw", "for-loop")),
                                         ("adamw-foreach", ("adamw", "foreach")), ("adamw-fused", ("adamw", "fused"))])
def test_a_trace_alone_says_which_optimizer_ran_and_gets_the_advice_that_applies(trace, said):
    """Three real AdamW steps (tests/data/predict/optimizer_steps): a user's own trace, no layer records."""
    from amp_bench.analysis.advice.evidence import from_profile
    from amp_bench.analysis.explain.trace import read_profile
    evidence = from_profile(read_profile(PREDICT / "optimizer_steps" / f"{trace}.json.gz", None))
    assert (evidence.case["optimizer"], evidence.case["optimizer_impl"]) == said
    rules = [item.rule for item in advise(evidence)]
    assert rules == ([] if said[1] == "fused" else ["optimizer_impl"])


def test_gemm_shapes_judge_alignment_where_no_layers_were_saved():
    from amp_bench.analysis.advice.evidence import misaligned_from_shapes
    shapes = [{"op": "aten::addmm", "dims": [[500], [16, 784], [784, 500], [], []], "count": 1},
              {"op": "aten::mm", "dims": [[16, 500], [500, 304]], "count": 2},
              {"op": "aten::convolution", "dims": [[16, 3, 32, 32], [64, 3, 3, 3]], "count": 1}]
    found = misaligned_from_shapes(shapes, 8)
    assert [(label, dims) for label, _, dims in found] == [("aten::addmm(16x784 @ 784x500)", {"N": 500}),
                                                           ("aten::mm(16x500 @ 500x304)", {"K": 500})]
    assert sum(share for _, share, _ in found) == pytest.approx(1.0)  # both GEMMs misaligned; the conv is not one
    assert misaligned_from_shapes(shapes[:1], 4) == []


def test_explain_trace_prints_the_advice_after_the_breakdown(capsys):
    from amp_bench.cli import main
    assert main(["explain", "--trace", str(PREDICT / "optimizer_steps" / "adamw-foreach.json.gz"), "--no-report"]) == 0
    out = capsys.readouterr().out
    assert "Advice (docs/advice.md)" in out and "1. use the fused adamw (fused=True)" in out
    assert out.index("Advice") > out.index("ms per step by category")
