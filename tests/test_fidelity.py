"""Accuracy parity on real shipped data: the runs learn, the comparison comes from the runs, the
verdict follows the tolerance, and the tables land in the run directory."""
import json
import math
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from amp_bench.analysis.fidelity import verdicts
from amp_bench.studies.fidelity.datasets import load
from amp_bench.studies.fidelity.orchestration import run_fidelity
from amp_bench.studies.fidelity.train import train_one
from amp_bench.suite import load_suite
from conftest import ROOT, amp_bench_cli


def _runs(rows):
    base = {"run_id": "r", "dataset": "digits", "model": "small_cnn", "status": "ok", "final_train_loss": 0.1}
    return pd.DataFrame([{**base, **r} for r in rows])


def test_verdicts_pair_by_seed_and_follow_the_tolerance():
    runs = _runs([
        {"precision": "fp32", "seed": 0, "test_accuracy": 0.90},
        {"precision": "fp32", "seed": 1, "test_accuracy": 0.94},
        {"precision": "amp_bf16", "seed": 0, "test_accuracy": 0.895},
        {"precision": "amp_bf16", "seed": 1, "test_accuracy": 0.94},
        {"precision": "amp_fp16", "seed": 0, "test_accuracy": 0.85},
        {"precision": "amp_fp16", "seed": 1, "test_accuracy": 0.87},
        {"precision": "tf32", "seed": 0, "test_accuracy": 0.95},
        {"precision": "tf32", "seed": 2, "test_accuracy": 0.10},
    ])
    table = verdicts(runs, tolerance_pp=1.0).set_index("precision")
    assert table.loc["fp32", "verdict"] == "reference"
    assert table.loc["fp32", "fp32_seed_range_pp"] == pytest.approx(4.0)
    assert table.loc["amp_bf16", "accuracy_diff_pp"] == pytest.approx(-0.25)
    assert table.loc["amp_bf16", "verdict"] == "parity"
    assert table.loc["amp_fp16", "accuracy_diff_pp"] == pytest.approx(-6.0)
    assert (table.loc["amp_fp16", "accuracy_diff_pp_min"], table.loc["amp_fp16", "accuracy_diff_pp_max"]) == \
        pytest.approx((-7.0, -5.0))
    assert table.loc["amp_fp16", "verdict"] == "worse"
    # seed 2 has no fp32 partner: only seed 0 is compared
    assert table.loc["tf32", "accuracy_diff_pp"] == pytest.approx(5.0)
    assert table.loc["tf32", "verdict"] == "better"
    assert verdicts(runs, tolerance_pp=7.0).set_index("precision").loc["amp_fp16", "verdict"] == "parity"
    assert table.loc["tf32", "paired_seeds"] == 1 and table.loc["amp_fp16", "paired_seeds"] == 2


def test_a_difference_exactly_at_the_tolerance_is_parity():
    # 0.96 - 0.97 is -1.0000000000000009 pp in floating point
    runs = _runs([{"precision": "fp32", "seed": 0, "test_accuracy": 0.97},
                  {"precision": "amp_bf16", "seed": 0, "test_accuracy": 0.96}])
    assert verdicts(runs, 1.0).set_index("precision").loc["amp_bf16", "verdict"] == "parity"


def test_verdicts_without_a_baseline_or_a_measurement():
    runs = _runs([{"precision": "fp32", "seed": 0, "test_accuracy": np.nan, "status": "error"},
                  {"precision": "amp_bf16", "seed": 0, "test_accuracy": 0.9},
                  {"precision": "amp_fp16", "seed": 0, "test_accuracy": np.nan, "status": "unsupported"}])
    table = verdicts(runs, 1.0).set_index("precision")
    assert table.loc["fp32", "verdict"] == "reference error"
    assert table.loc["amp_bf16", "verdict"] == "no fp32 baseline"
    assert math.isnan(table.loc["amp_bf16", "accuracy_diff_pp"])
    assert table.loc["amp_fp16", "verdict"] == "not measured (unsupported)"


def test_the_data_is_real_and_the_split_fixed():
    digits = load("digits")
    assert digits.num_classes == 10 and digits.train_x.shape[1:] == (1, 8, 8)
    assert len(digits.train_x) + len(digits.test_x) == 1797
    again = load("digits")
    assert np.array_equal(digits.test_y.numpy(), again.test_y.numpy())
    # stratified: every class is in the held-out part
    assert set(digits.test_y.tolist()) == set(range(10))
    cancer = load("breast_cancer")
    assert cancer.kind == "tabular" and cancer.train_x.shape[1] == 30 and cancer.num_classes == 2


def _spec(**fields):
    suite = ROOT / "suites" / "fidelity.yaml"
    spec = load_suite(suite).fidelity_spec("cpu")
    import dataclasses
    return dataclasses.replace(spec, **fields)


@pytest.mark.slow
def test_same_seed_same_run_and_the_transformer_learns():
    import torch
    split = load("digits")
    spec = _spec(epochs=1, seeds=(0,))
    first, second = (train_one(spec, "fp32", 0, "cpu", torch.device("cpu"), split, lambda **e: None) for _ in range(2))
    assert [s["loss"] for s in first["step_table"]] == [s["loss"] for s in second["step_table"]]
    assert first["test_accuracy"] == second["test_accuracy"]
    tabular = _spec(dataset="breast_cancer", model="tabular_transformer", epochs=8, batch_size=32)
    cancer = load("breast_cancer")
    record = train_one(tabular, "fp32", 0, "cpu", torch.device("cpu"), cancer, lambda **e: None)
    majority = max(cancer.test_y.float().mean().item(), 1 - cancer.test_y.float().mean().item())
    assert record["test_accuracy"] > majority + 0.1


FIDELITY_SUITE = """
name: fid
precisions: [fp32, amp_bf16]
allow_emulated: true  # bf16 runs on every CPU (emulated where it has no bf16 ISA)
fidelity: {dataset: digits, model: mlp, epochs: 3, seeds: [0], tolerance_pp: 1.5}
"""  # mlp: the linear model trains in a fraction of the CNN's time, above all where bf16 is emulated


@pytest.mark.slow
def test_fidelity_run_on_cpu_learns_and_compares(write_suite, tmp_path):
    runs = run_fidelity(write_suite(FIDELITY_SUITE), device="cpu", results_dir=tmp_path / "results")
    by = runs.set_index("precision")
    assert list(runs["status"]) == ["ok", "ok"], runs["reason"].tolist()
    assert by.loc["fp32", "test_accuracy"] > 0.8  # chance is 0.1
    assert by.loc["fp32", "data_source"].startswith("sklearn.datasets.load_digits")
    assert by.loc["fp32", "test_examples"] == 450
    assert set(runs["worker_start"]) == {"fork"}  # each precision's worker a child of the study's fork server
    table = runs.attrs["verdicts"].set_index("precision")
    diff = (by.loc["amp_bf16", "test_accuracy"] - by.loc["fp32", "test_accuracy"]) * 100
    assert table.loc["amp_bf16", "accuracy_diff_pp"] == pytest.approx(diff)
    assert table.loc["amp_bf16", "verdict"] == ("parity" if abs(diff) <= 1.5 else "worse" if diff < 0 else "better")
    run_dir = tmp_path / "results" / runs.attrs["run_dir"].split("/")[-1]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["kind"] == "fidelity" and manifest["status"] == "complete"
    assert manifest["fidelity"]["tolerance_pp"] == 1.5
    steps = pd.read_csv(run_dir / "fidelity_steps.csv")
    epochs = pd.read_csv(run_dir / "fidelity_epochs.csv")
    probes = pd.read_csv(run_dir / "fidelity_probes.csv")
    assert len(steps[steps.precision == "fp32"]) == by.loc["fp32", "steps"] == 3 * math.ceil(1347 / 64)
    assert list(epochs[epochs.precision == "amp_bf16"]["epoch"]) == [0, 1, 2]
    assert set(probes["precision"]) == {"amp_bf16"} and len(probes) == 3  # once per epoch
    assert (run_dir / "results.csv").exists()  # a run directory like any other

    from amp_bench.report import build_report
    written = build_report([run_dir], tmp_path / "report.html", formats=("md", "csv"))  # md: plotly optional
    md = written["md"].read_text()
    assert "## Accuracy parity (fidelity)" in md and "amp_bf16" in md
    assert "## Step time" not in md  # no benchmark rows: no empty benchmark sections


FP16_SUITE = """
name: fid16
precisions: [fp32, amp_fp16]
allow_emulated: true
fidelity: {dataset: digits, model: mlp, epochs: 1, batch_size: 128, seeds: [0]}
"""


@pytest.mark.slow
def test_fidelity_cli_with_fp16_records_the_scaler(write_suite, tmp_path):
    suite = write_suite(FP16_SUITE)
    proc = subprocess.run([sys.executable, "-m", "amp_bench", "fidelity", str(suite), "--device", "cpu",
                           "--results-dir", str(tmp_path / "results"), "--no-report"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**__import__("os").environ, "COLUMNS": "200"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "held-out accuracy against fp32" in proc.stdout
    assert any(v in proc.stdout for v in ("parity", "worse", "better"))
    run_dir = next((tmp_path / "results").iterdir())
    runs = pd.read_csv(run_dir / "fidelity.csv").set_index("precision")
    assert runs.loc["amp_fp16", "status"] == "ok"
    assert runs.loc["amp_fp16", "scaler_initial_scale"] == 65536.0
    assert runs.loc["amp_fp16", "scaler_min_scale"] >= 1.0
    assert not runs.loc["amp_fp16", "scaler_scale_below_one"]
    steps = pd.read_csv(run_dir / "fidelity_steps.csv")
    assert steps[steps.precision == "amp_fp16"]["scale"].notna().all()
    assert steps[steps.precision == "fp32"]["scale"].isna().all()
    probes = pd.read_csv(run_dir / "fidelity_probes.csv")
    assert (probes["probe_scale"] == 65536.0).all()


@pytest.mark.parametrize("text, message", [
    ("fidelity: {dataset: mnist}", "fidelity.dataset: expected one of digits, breast_cancer, got 'mnist'"),
    ("fidelity: {dataset: digits, model: tabular_transformer}",
     "fidelity.model: tabular_transformer does not take the digits dataset"),
    ("fidelity: {dataset: digits, epoch: 3}", "fidelity.epoch: unknown key (did you mean 'epochs'?"),
    ("fidelity: {dataset: digits, model: torchvision/resnet5}", "fidelity.model: unknown torchvision model"),
    ("fidelity: {seeds: []}", "fidelity.seeds: empty list"),
    ("fidelity: 3", "fidelity: expected a mapping"),
    ("models: [python:toy_models:mlp]\nbatch_sizes: [4]\nheadroom: {memory_cap_gb: -1}",
     "headroom.memory_cap_gb: expected a number > 0"),
    ("models: [python:toy_models:mlp]\nbatch_sizes: [4]\nheadroom: {resolution: 0}",
     "headroom.resolution: expected an integer between 1"),
])
def test_bad_sections_get_one_line_each(write_suite, text, message):
    from amp_bench.errors import SuiteError
    with pytest.raises(SuiteError) as info:
        load_suite(write_suite(text))
    assert any(message in line for line in info.value.lines), info.value.lines


def test_a_fidelity_section_in_a_device_block_only(write_suite):
    from amp_bench.cli import main
    path = write_suite("models: [python:toy_models:mlp]\nbatch_sizes: [4]\ncuda: {fidelity: {epochs: 2}}")
    suite = load_suite(path)
    assert suite.fidelity_spec("cuda").epochs == 2
    assert main(["validate", str(path)]) == 0
    block_only = load_suite(write_suite("cpu: {fidelity: {epochs: 1}}", name="block.yaml"))
    assert not block_only.has_matrix and block_only.fidelity_spec("cpu").epochs == 1


def test_a_fidelity_only_suite_refuses_run_with_a_clear_line(write_suite, tmp_path):
    suite = write_suite("fidelity: {dataset: digits}")
    proc = amp_bench_cli("run", suite, "--device", "cpu", "--results-dir", tmp_path)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "models, batch_sizes: missing" in proc.stderr and "amp_bench fidelity" in proc.stderr
    validate = amp_bench_cli("validate", suite)
    assert validate.returncode == 0 and "fidelity on cpu: small_cnn on digits" in validate.stdout


def test_failed_rows_name_precision_seed_and_reason():
    from amp_bench.analysis.fidelity import failed_rows
    runs = _runs([{"precision": "fp32", "seed": 0, "test_accuracy": 0.9},
                  {"precision": "amp_fp16", "seed": 1, "status": "unsupported", "reason": "no fp16 here"},
                  {"precision": "amp_bf16", "seed": 2, "status": "timeout", "reason": "worker ran past 60 s\nmore"},
                  {"precision": "amp_bf16", "seed": 3, "status": "error", "reason": np.nan}])
    assert failed_rows(runs) == ["amp_bf16 seed 2: timeout (worker ran past 60 s)", "amp_bf16 seed 3: error"]
    # the GPU check needs every row measured: unsupported fails there too
    assert failed_rows(runs, allow_unsupported=False)[0] == "amp_fp16 seed 1: unsupported (no fp16 here)"
    assert failed_rows(runs[runs["status"] == "ok"]) == []
