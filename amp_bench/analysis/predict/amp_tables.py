"""Scoring predicted AMP speedups against the public single-GPU tables (tests/data/predict/amp_pairs.csv:
NVIDIA DeepLearningExamples READMEs, Lambda's deeplearning-benchmark CSVs), beside the two naive
baselines; torch-free (pandas).

- measured speedup: the AMP arm's throughput over the baseline arm's, each at its own published batch
  (the pairs' own "speedup" column, where printed, is kept to check the recomputation);
- "source GPU's speedup": assume the speedup measured on another GPU of the same table and model carries
  over; every other GPU is tried, so a pair gets the spread of that guess;
- "peak ratio": the target's dense 16-bit tensor peak over the peak its baseline ran on (FP32 SIMT or TF32);
- error: |log(predicted / measured)| (symmetric: 2x too high and 2x too low weigh the same), reported as
  the factor exp(error); GPU ranking: Kendall's tau between predicted and measured speedups across the
  GPUs of one table and model.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from amp_bench.platform.gpu_specs import by_key

KEYS = ["table", "model", "gpu"]


def measured_speedup(pairs: pd.DataFrame) -> pd.Series:
    return pairs["amp_throughput"] / pairs["baseline_throughput"]


def peak_ratio(pairs: pd.DataFrame) -> pd.Series:
    """fp16 tensor peak / the baseline's peak (TF32 where the baseline ran TF32, else FP32), per pair."""
    specs = by_key()

    def ratio(row):
        spec = specs.get(str(row["target"]))
        if spec is None:
            return np.nan
        base = "tf32" if row["baseline"] == "tf32" and spec.peak("tf32") else "fp32"
        return spec.peak("fp16") / spec.peak(base)
    return pairs.apply(ratio, axis=1)


def source_gpu_errors(pairs: pd.DataFrame) -> pd.DataFrame:
    """Every (other GPU -> this GPU) guess within a table and model: |log error| of using the other's speedup."""
    rows = []
    for (table, model), group in pairs.groupby(["table", "model"]):
        speedups = dict(zip(group["gpu"], group["measured_speedup"], strict=True))
        for gpu, actual in speedups.items():
            for other, guess in speedups.items():
                if other != gpu:
                    rows.append({"table": table, "model": model, "gpu": gpu, "from": other,
                                 "log_error": abs(np.log(guess / actual))})
    return pd.DataFrame(rows, columns=["table", "model", "gpu", "from", "log_error"])


def log_error(predicted: pd.Series, measured: pd.Series) -> pd.Series:
    return (np.log(predicted) - np.log(measured)).abs()


def kendall(group: pd.DataFrame, column: str) -> float:
    """Kendall's tau between a predictor's speedups and the measured ones across a table's GPUs."""
    if len(group) < 3 or group[column].nunique() < 2:
        return np.nan
    return float(group[column].corr(group["measured_speedup"], method="kendall"))


def score(pairs: pd.DataFrame, predictions: pd.DataFrame) -> pd.DataFrame:
    """One row per scored pair: measured, predicted (model), the baselines and their |log error|s."""
    table = pairs.merge(predictions, on=["pair"], how="left")
    table["measured_speedup"] = measured_speedup(table)
    table["peak_ratio"] = peak_ratio(table)
    guesses = source_gpu_errors(table[table["scored"]])
    spread = guesses.groupby(["table", "model", "gpu"])["log_error"].agg(["median", "max"]).rename(
        columns={"median": "source_gpu_median_log_error", "max": "source_gpu_worst_log_error"})
    table = table.join(spread, on=["table", "model", "gpu"])
    table["model_log_error"] = log_error(table["predicted_speedup"], table["measured_speedup"])
    table["peak_ratio_log_error"] = log_error(table["peak_ratio"], table["measured_speedup"])
    table["inside_interval"] = (table["predicted_speedup_low"] <= table["measured_speedup"]) & \
        (table["measured_speedup"] <= table["predicted_speedup_high"])
    return table


def summary(scored: pd.DataFrame) -> pd.DataFrame:
    """Median and worst error (as a factor) of each predictor over the scored pairs, and how many GPU
    rankings (table x model groups of 3+ GPUs) each kept."""
    rows = []
    scored = scored[scored["scored"] & scored["predicted_speedup"].notna()]
    guesses = source_gpu_errors(scored)
    for name, errors in (("amp_bench (CPU op inventory)", scored["model_log_error"]),
                         ("peak ratio", scored["peak_ratio_log_error"]),
                         ("source GPU's speedup (every other GPU)", guesses["log_error"])):
        rows.append({"predictor": name, "pairs": len(errors), "median error x": float(np.exp(errors.median())),
                     "worst error x": float(np.exp(errors.max()))})
    out = pd.DataFrame(rows)
    taus = {c: [kendall(g, c) for _, g in scored.groupby(["table", "model"])]
            for c in ("predicted_speedup", "peak_ratio")}
    out["median Kendall tau"] = [pd.Series(taus["predicted_speedup"], dtype=float).median(),
                                 pd.Series(taus["peak_ratio"], dtype=float).median(), np.nan]  # one guess: no ranking
    return out
