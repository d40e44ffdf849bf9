"""Scoring predicted AMP speedups and throughputs against the public single-GPU tables
(tests/data/predict/amp_pairs.csv: NVIDIA DeepLearningExamples READMEs, Lambda's deeplearning-benchmark
CSVs), beside the naive guesses; torch-free (pandas). The predictions are the cross-validated ones
benchmarks/predict_fit.py freezes in docs/predict/amp_crossval.csv: each made by a fit that never saw the
pair's GPU (scheme "gpu"), its model ("model") or its network ("network").

- measured speedup: the AMP arm's throughput over the baseline arm's, each at its own published batch
  (the pairs' own "speedup" column, where printed, is kept to check the recomputation);
- the naive guesses: "peak ratio", the target's dense 16-bit tensor peak over the peak its baseline ran on
  (FP32 SIMT or TF32); "another GPU's speedup", the median of the same table's model measured on the other
  GPUs (what leaving a GPU out keeps); "another model's speedup", the median of the same table's GPU
  measured on the other models (what leaving a model out keeps);
- error: |log(predicted / measured)| (symmetric: 2x too high and 2x too low weigh the same), reported as
  the factor exp(error), median / worst; GPU ranking: Kendall's tau between predicted and measured speedups
  across the GPUs of one table and model.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from amp_bench.platform.gpu_specs import by_key

HELD_OUT = {"gpu": "one GPU", "model": "one model", "network": "one network"}


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


def guesses(pairs: pd.DataFrame) -> pd.DataFrame:
    """Per scored pair, each naive guess's |log error|: peak ratio, another GPU's, another model's speedup."""
    scored = pairs[pairs["scored"]].copy()
    scored["measured_speedup"] = measured_speedup(scored)

    def median_of(row, same: str, other: str) -> float:
        rest = scored[(scored["table"] == row["table"]) & (scored[same] == row[same]) & (scored[other] != row[other])]
        return abs(np.log(rest["measured_speedup"].median() / row["measured_speedup"])) if len(rest) else np.nan
    return pd.DataFrame({"pair": scored["pair"],
                         "peak_ratio_error": np.abs(np.log(peak_ratio(scored) / scored["measured_speedup"])),
                         "other_gpus_error": scored.apply(median_of, axis=1, args=("model", "target")),
                         "other_models_error": scored.apply(median_of, axis=1, args=("target", "model"))})


def scored(rows: pd.DataFrame, pairs: pd.DataFrame) -> pd.DataFrame:
    """The frozen predictions beside the pairs: measured speedup and each log error (predicted / measured)."""
    out = rows.merge(pairs, on="pair")
    out["measured_speedup"] = measured_speedup(out)
    out["speedup_log_error"] = np.log(out["predicted_speedup"] / out["measured_speedup"])
    out["baseline_log_error"] = np.log(out["predicted_baseline_throughput"] / out["baseline_throughput"])
    out["amp_log_error"] = np.log(out["predicted_amp_throughput"] / out["amp_throughput"])
    return out


def factor(errors) -> str:
    """'1.084 / 1.312': the median and the worst |log error| as factors."""
    errors = np.abs(np.asarray(errors, dtype=float))
    return f"{np.exp(np.nanmedian(errors)):.3f} / {np.exp(np.nanmax(errors)):.3f}"


def kendall(group: pd.DataFrame, column: str) -> float:
    """Kendall's tau between a predictor's speedups and the measured ones across a table's GPUs."""
    if len(group) < 3 or group[column].nunique() < 2:
        return np.nan
    return float(group[column].corr(group["measured_speedup"], method="kendall"))


def summary(rows: pd.DataFrame, pairs: pd.DataFrame) -> pd.DataFrame:
    """Per scheme: the model's speedup and throughput errors (median / worst), the naive guesses', the share
    of measured speedups inside the predicted interval and its median width (high / low), and the median
    Kendall tau of the GPU rankings (one GPU left out: every GPU of a table and model predicted)."""
    table = scored(rows, pairs).merge(guesses(pairs), on="pair")
    out = []
    for scheme, group in table.groupby("scheme", sort=False):
        inside = group["predicted_speedup_low"].le(group["measured_speedup"]) & \
            group["measured_speedup"].le(group["predicted_speedup_high"])
        taus = [kendall(g, "predicted_speedup") for _, g in group.groupby(["table", "model"])]
        arms = np.concatenate([group["baseline_log_error"], group["amp_log_error"]])
        width = group["predicted_speedup_high"] / group["predicted_speedup_low"]
        out.append({"held out": HELD_OUT.get(scheme, scheme), "pairs": len(group),
                    "speedup (median / worst)": factor(group["speedup_log_error"]),
                    "peak ratio": factor(group["peak_ratio_error"]),
                    "another GPU's speedup": factor(group["other_gpus_error"]),
                    "another model's speedup": factor(group["other_models_error"]),
                    "samples/s, each arm": factor(arms), "inside interval": f"{inside.mean():.0%}",
                    "interval width": f"{width.median():.2f}",
                    "GPU ranking tau": f"{pd.Series(taus, dtype=float).median():.2f}"})
    return pd.DataFrame(out)
