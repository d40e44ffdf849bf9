"""Advice on GPUs this machine does not have: each change a GPU case could take (channels_last, a padded
vocabulary, the fused optimizer) recorded on fake tensors as is and changed, priced on each target
(studies/gpu_advice.py, analysis/advice/targets.py), printed by `run` and `explain`, kept in
predicted_advice.csv, a prediction and never a measurement."""
import dataclasses
import shutil
from collections import Counter
from pathlib import Path
from unittest import mock

import pandas as pd
import pytest

from amp_bench.analysis.advice import targets
from amp_bench.analysis.predict.model import INTERVALS, Predicted
from amp_bench.cli import main
from amp_bench.store.results import load_results, read_table
from amp_bench.studies import gpu_advice
from amp_bench.suite import load_suite

DATA = Path(__file__).resolve().parent / "data" / "predict"
TARGETS = ["a100-80gb", "h100-sxm", "l4"]
# a 2-layer GPT-2 with GPT-2's vocabulary (lm_head 50257 wide: misaligned) and a torchvision CNN in NCHW, both
# with a foreach AdamW, at the sizes a GPU would train them: fake tensors make the size free
SUITE = """name: gpu-advice
models:
  - ref: transformers/gpt2
    label: gpt2-vocab50257
    config: {n_layer: 2, n_embd: 256, n_head: 4, vocab_size: 50257, n_positions: 256}
    attn_implementation: sdpa
  - torchvision/resnet18
image_size: 224
seq_len: 256
batch_sizes: [32]
precisions: [fp32, amp_bf16]
optimizer: {name: adamw, impl: foreach, lr: 0.001}
"""


@pytest.fixture(autouse=True)
def wide_console(monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")


@pytest.fixture(scope="module")
def priced(tmp_path_factory) -> pd.DataFrame:
    """The suite's GPU cases and their changes priced on three GPUs, as predicted_advice.csv's rows."""
    suite = tmp_path_factory.mktemp("gpu-advice") / "suite.yaml"
    suite.write_text(SUITE)
    items = gpu_advice.price(load_suite(suite).cases("cuda"), TARGETS)
    return pd.DataFrame(gpu_advice.rows(items, TARGETS))


def _item(table: pd.DataFrame, model: str, rule: str, precision: str) -> pd.DataFrame:
    return table[(table["model"] == model) & (table["rule"] == rule) & (table["precision"] == precision)]


# --------------------------------------------------------------------------- which changes a case could take

def test_the_changes_a_gpu_rewards_are_the_ones_the_case_does_not_make_yet(tmp_path):
    (tmp_path / "suite.yaml").write_text(SUITE)
    gpt2, resnet = (c for c in load_suite(tmp_path / "suite.yaml").cases("cuda") if c.precision == "amp_bf16")
    assert [c.rule for c in gpu_advice.changes(gpt2, {"vocab_size": 50257}, False)] == ["pad_dims", "optimizer_impl"]
    assert gpu_advice.changes(gpt2, {"vocab_size": 50257}, False)[0].change.endswith("(50257 -> 50304)")
    assert [c.rule for c in gpu_advice.changes(resnet, {}, True)] == ["channels_last", "optimizer_impl"]
    done = dataclasses.replace(resnet, channels_last=True, optimizer=dataclasses.replace(resnet.optimizer,
                                                                                         impl="fused"))
    assert gpu_advice.changes(done, {}, True) == []
    assert gpu_advice.changes(dataclasses.replace(gpt2, optimizer=done.optimizer), {"vocab_size": 50304}, False) == []


# --------------------------------------------------------------------------- the gain and its interval

def _predicted(step_ms: float, categories: dict) -> Predicted:
    return Predicted(step_ms, None, "recorded", Counter(), categories)


def test_a_gain_is_the_ratio_of_the_priced_steps_and_never_more_than_the_changed_ops_time():
    base = _predicted(10.0, {"gemm": (0, 3.0), "elementwise": (0, 7.0)})
    gain = targets.target_gain("pad_dims", base, _predicted(8.0, {}), "how")
    assert gain.step_ms / gain.predicted_ms == pytest.approx(1.25)
    least, most = INTERVALS["recorded"]  # a priced time is this many times the truth, held out
    assert most * 2.0 > 3.0 and gain.low_ms == pytest.approx(10.0 - 3.0)  # capped at the GEMMs' 3 ms
    assert gain.high_ms == pytest.approx(10.0 - 2.0 * least)
    assert targets.verdict(gain) == "gain"
    assert targets.verdict(targets.target_gain("pad_dims", base, _predicted(9.9, {}), "")) == "none"
    assert targets.verdict(targets.target_gain("pad_dims", base, _predicted(10.5, {}), "")) == "slower"


def test_a_loss_is_said_as_one_and_a_case_without_gain_in_one_line_per_change():
    rows = pd.DataFrame([
        {"case": "a bs 8", "precision": "amp_bf16", "model": "a", "rule": "pad_dims", "change": "pad it",
         "target_label": "A100", "status": "gain", "gain": 1.5, "gain_low": 1.2, "gain_high": 1.8, "reason": ""},
        {"case": "a bs 8", "precision": "amp_bf16", "model": "a", "rule": "pad_dims", "change": "pad it",
         "target_label": "L4", "status": "slower", "gain": 0.9, "gain_low": 0.8, "gain_high": 1.0, "reason": ""},
        {"case": "a bs 8", "precision": "fp32", "model": "a", "rule": "pad_dims", "change": "pad it",
         "target_label": "A100", "status": "none", "gain": 1.0, "gain_low": 0.9, "gain_high": 1.1, "reason": ""}])
    lines = targets.gpu_lines(rows)
    assert lines[0] == ("a bs 8 amp_bf16: pad it (pad_dims): ~1.50x on A100 (1.20-1.80x), "
                        "slower on L4 (~0.90x: not advised there)")
    assert lines[1].startswith("no gain predicted from pad_dims") and lines[1].endswith("a bs 8 fp32")
    assert targets.on_gpus(rows, "a", "amp_bf16", "pad_dims").startswith("; on GPUs (predicted for a bs 8: ~1.50x")
    assert targets.on_gpus(rows, "a", "amp_bf16", "channels_last") == ""


# --------------------------------------------------------------------------- priced on fake-tensor steps

def test_padding_gpt2s_vocabulary_gains_in_bf16_on_every_target_and_nothing_in_fp32(priced):
    bf16 = _item(priced, "gpt2-vocab50257", "pad_dims", "amp_bf16")
    assert list(bf16["target"]) == TARGETS and (bf16["status"] == "gain").all()
    assert (bf16["gain_low"] > 1.0).all() and (bf16["gain_low"] <= bf16["gain"]).all()
    assert (bf16["gain"] <= bf16["gain_high"]).all()
    assert (_item(priced, "gpt2-vocab50257", "pad_dims", "fp32")["status"] == "none").all()  # FP32 SIMT: no TC


def test_channels_last_and_the_fused_optimizer_gain_on_a_cnn_in_bf16(priced):
    layout = _item(priced, "resnet18", "channels_last", "amp_bf16")
    assert (layout["status"] == "gain").sum() >= 2 and (layout["gain"] > 1.05).all()
    assert (_item(priced, "resnet18", "channels_last", "fp32")["status"] == "none").all()
    fused = _item(priced, "resnet18", "optimizer_impl", "amp_bf16")
    assert (fused["status"] == "gain").sum() >= 2 and fused["how"].str.contains("fake-tensor steps").all()


# --------------------------------------------------------------------------- the commands

def _cpu_run(tmp_path: Path) -> Path:
    run = tmp_path / "results" / "cpu_run"
    shutil.copytree(DATA / "cpu_run", run)
    (run / "suite.yaml").write_text(SUITE)
    return run


def test_explain_prints_each_changes_gain_on_the_targets_it_is_given(tmp_path, capsys, priced):
    from amp_bench.studies.explain_suite import Explained
    run = _cpu_run(tmp_path)
    results = load_results(run)
    results.attrs["run_dir"] = run
    with mock.patch("amp_bench.studies.explain_suite.explain_suite", return_value=Explained(results)):
        assert main(["explain", str(run / "suite.yaml"), "--target", "a100-80gb,h100-sxm", "--no-report"]) == 0
    out = capsys.readouterr().out
    assert "advice on GPUs (predicted from fake-tensor steps, nothing measured here" in out
    line = next(x for x in out.splitlines() if "amp_bf16: pad the vocabulary" in x)
    assert "x on A100 SXM 80GB (" in line and "x on H100 SXM 80GB (" in line and "L4" not in line
    table = read_table([run], "predicted_advice")
    assert set(table["target"]) == {"a100-80gb", "h100-sxm"} and set(table["rule"]) == {
        "pad_dims", "channels_last", "optimizer_impl"}


def test_target_none_predicts_nothing_and_only_run_and_explain_take_it(tmp_path, capsys):
    """`--target none`: no recording and no predicted table at a run's or an explain's end, said in one line;
    `predict`, whose whole job is the prediction, refuses it."""
    from amp_bench.studies.explain_suite import Explained
    run = _cpu_run(tmp_path)
    results = load_results(run)
    results.attrs["run_dir"] = run
    with mock.patch("amp_bench.studies.explain_suite.explain_suite", return_value=Explained(results)), \
            mock.patch("amp_bench.studies.gpu_predictions.record_missing") as record:
        assert main(["explain", str(run / "suite.yaml"), "--target", "none", "--no-report"]) == 0
    assert not record.called and "On GPUs: not predicted (--target none)" in capsys.readouterr().out
    assert not (run / "predicted_advice.csv").exists() and not (run / "predicted.csv").exists()
    assert main(["predict", str(run / "suite.yaml"), "--target", "none"]) == 2
    assert "--target: unknown GPU 'none'" in capsys.readouterr().err
    assert main(["run", str(run / "suite.yaml"), "--target", "a100-80gb,none"]) == 2  # none is alone or not at all
    assert "--target: unknown GPU 'none'" in capsys.readouterr().err


def test_a_gpu_run_prices_changes_only_when_given_targets(tmp_path):
    run = _cpu_run(tmp_path)
    with mock.patch("amp_bench.analysis.predict.source.is_gpu_run", return_value=True):
        assert gpu_advice.for_run(run) is None
    assert not (run / "predicted_advice.csv").exists()


def test_a_prediction_of_advice_is_never_read_as_a_measurement(tmp_path, capsys, priced):
    run = _cpu_run(tmp_path)
    assert gpu_advice.for_run(run, TARGETS)
    assert (run / "predicted_advice.csv").is_file()
    capsys.readouterr()
    for argv in (["compare", str(run), str(run)], ["nightly", str(tmp_path / "results")]):
        main(argv)
        assert "A100" not in capsys.readouterr().out
    assert "A100" not in load_results(run).to_csv()


def test_the_report_shows_each_change_per_gpu_in_the_predicted_section(tmp_path, priced):
    from amp_bench.report import build_report
    run = _cpu_run(tmp_path)
    assert gpu_advice.for_run(run, TARGETS)
    written = build_report([run], tmp_path / "report.html")
    section = written["html"].read_text().split("<h2 id='predict'>", 1)[1].split("<h2 id=", 1)[0]
    assert "Changes a GPU rewards" in section and "pad the vocabulary to a multiple of 64" in section
    assert "x on A100 SXM 80GB (" in section
    assert "| gpt2-vocab50257 bs 32 seq 256 | amp_bf16 | pad the vocabulary" in written["md"].read_text()
