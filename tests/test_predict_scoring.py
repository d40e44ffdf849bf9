"""The scoring machinery of docs/predict.md: the published AMP tables recomputed, the naive
baselines on hand-made pairs, NeuSight's labels read the way its aggregator reads them, and the frozen
predictions scored without error. Which predictor wins is docs/predict.md's business, not a test's."""
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from amp_bench.analysis.predict import amp_tables, neusight
from amp_bench.platform.gpu_specs import by_key

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "predict"
PAIRS = pd.read_csv(DATA / "amp_pairs.csv")


def test_every_printed_speedup_is_the_ratio_of_its_rows_throughputs():
    """The DLE READMEs print the speedup beside the two throughputs: recomputing it checks the transcription
    (e.g. ResNet-50 on A100 80GB: 2470 / 938 img/s = 2.63x)."""
    printed = PAIRS[PAIRS["published_speedup"].notna()]
    assert len(printed) == 9
    recomputed = amp_tables.measured_speedup(printed).round(2)
    assert (recomputed - printed["published_speedup"]).abs().max() <= 0.011
    a100 = printed[(printed["model"] == "resnet50") & (printed["target"] == "a100-80gb")].iloc[0]
    assert (a100["baseline"], a100["baseline_layout"], a100["amp_layout"]) == ("tf32", "nchw", "nhwc")


def test_a_lambda_row_matches_the_published_figure():
    """Lambda's table (lambdal/deeplearning-benchmark, pytorch-train-throughput-*.csv) has ResNet-50 on A100 80GB
    SXM at 1066 -> 1582 img/s, 1.48x, as gpu_check/tables.py's anchors quote it."""
    row = PAIRS[(PAIRS["table"] == "Lambda v1") & (PAIRS["gpu"] == "A100 80GB SXM4") & (PAIRS["model"] == "resnet50")]
    assert row[["baseline_throughput", "amp_throughput"]].iloc[0].tolist() == [1066.0, 1582.0]
    assert amp_tables.measured_speedup(row).round(2).iloc[0] == 1.48
    assert row["baseline"].iloc[0] == "tf32" and row["baseline_batch"].iloc[0] * 2 == row["amp_batch"].iloc[0]


def test_only_pairs_with_a_spec_a_model_and_a_first_machine_are_scored():
    scored = PAIRS[PAIRS["scored"]]
    assert scored["target"].notna().all() and not scored.duplicated(["table", "model", "target"]).any()
    assert set(scored["model"]) <= {"resnet50", "bert_base_squad", "bert_large_squad", "bert_large_pretrain_128",
                                    "bert_large_pretrain_512"}
    assert PAIRS[PAIRS["target"].isna()]["note"].str.contains("no spec-table entry").all()


def test_the_naive_baselines_on_hand_made_pairs():
    """Three GPUs of one table, two models: the peak ratio from the spec table; another GPU's speedup is the
    median of the same model's on the other GPUs; another model's, the same GPU's other model."""
    pairs = pd.DataFrame({"pair": range(6), "table": "t", "scored": True, "model": ["m"] * 3 + ["n"] * 3,
                          "target": ["v100-sxm2", "a100-80gb", "h100-sxm"] * 2,
                          "baseline": ["fp32", "tf32", "tf32"] * 2,
                          "baseline_throughput": 100.0, "amp_throughput": [300.0, 150.0, 200.0, 400.0, 200.0, 100.0]})
    ratio = amp_tables.peak_ratio(pairs)
    assert ratio.iloc[0] == pytest.approx(125 / 15.7) and ratio.iloc[1] == pytest.approx(2.0)
    errors = amp_tables.guesses(pairs).set_index("pair")
    assert errors.loc[0, "other_gpus_error"] == pytest.approx(abs(np.log(1.75 / 3.0)))  # median of 1.5 and 2.0
    assert errors.loc[0, "other_models_error"] == pytest.approx(abs(np.log(4.0 / 3.0)))
    assert errors.loc[1, "peak_ratio_error"] == pytest.approx(abs(np.log(2.0 / 1.5)))
    measured = pairs.assign(measured_speedup=amp_tables.measured_speedup(pairs))
    assert amp_tables.kendall(measured.iloc[:3].assign(p=[9, 1, 5]), "p") == pytest.approx(1.0)
    assert amp_tables.kendall(measured.iloc[:3].assign(p=[1, 9, 5]), "p") == pytest.approx(-1.0)


def test_neusight_rows_replicate_the_layer_and_a_gpu_predicts_itself():
    labels = pd.read_csv(DATA / "neusight_labels.csv.gz")
    e2e = pd.read_csv(DATA / "neusight_e2e.csv")
    rows = labels[(labels["gpu"] == "Tesla_V100-PCIE-32GB") & (labels["workload"] == "bert_large-train-512-2")]
    weights = neusight.repeats(rows, 24)
    inside = rows.loc[weights == 24, "name"]
    assert inside.iloc[0] == "bert_encoder_layer_0_attention_self_query" and weights.value_counts()[24] == len(inside)
    spec = by_key()["v100-pcie"]
    same = neusight.predict_pair(rows, spec, spec)
    assert np.allclose(same["model_ms"], same["source_ms"])  # the rules are the identity from a GPU to itself
    gemm = same[(same["name"] == "bert_encoder_layer_0_intermediate_dense") & (same["phase"] == "fw")].iloc[0]
    assert gemm["roofline_ms"] == pytest.approx(2 * 1024 * 1024 * 4096 / 14.0e12 * 1e3)  # 2MKN at the FP32 peak
    assert set(e2e["gpu"]) <= set(neusight.GPUS)


def test_the_frozen_predictions_score_every_pair():
    frozen = ROOT / "docs" / "predict" / "neusight_predictions.csv.gz"
    if not frozen.is_file():
        pytest.skip("no frozen NeuSight predictions yet")
    labels, e2e = pd.read_csv(DATA / "neusight_labels.csv.gz"), pd.read_csv(DATA / "neusight_e2e.csv")
    scored = neusight.score(pd.read_csv(frozen), labels, e2e)
    assert scored["rows"]["measured_ms"].notna().all()
    pairs = scored["e2e"]
    assert (pairs["n"] > 0).all() and ("all", "all") in set(zip(pairs["source"], pairs["target"], strict=True))
    crossval = pd.read_csv(ROOT / "docs" / "predict" / "amp_crossval.csv")
    for scheme, rows in crossval.groupby("scheme"):  # every scored pair predicted once per scheme
        assert sorted(rows["pair"]) == sorted(PAIRS.loc[PAIRS["scored"], "pair"]), scheme
    summary = amp_tables.summary(crossval, PAIRS)
    assert list(summary["held out"]) == ["one GPU", "one model", "one network"]
