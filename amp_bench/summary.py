"""Pair every precision with the fp32 (and tf32) baseline of the same model, batch size, layout
and device, and compute speedup and memory saving from medians across repeats."""
from __future__ import annotations

import numpy as np
import pandas as pd

# A precision is only ever paired with a baseline from the same run (same machine, suite, torch).
GROUP_KEYS = ["run_id", "suite", "model_label", "batch_size", "image_size", "seq_len", "channels_last", "device",
              "device_name"]


def _memory(frame: pd.DataFrame) -> pd.Series:
    """Peak memory per row: CUDA allocator peak on GPUs, the worker's peak RSS on the CPU."""
    cuda = frame.get("peak_mem_allocated_bytes", pd.Series(np.nan, index=frame.index))
    return cuda.where(frame["device"] == "cuda", frame.get("peak_rss_bytes"))


def _above_baseline(frame: pd.DataFrame) -> pd.Series:
    """CPU only: peak RSS minus the RSS before the model was built (drops torch's own footprint)."""
    if "rss_before_model_bytes" not in frame:
        return pd.Series(np.nan, index=frame.index)
    growth = frame["peak_rss_bytes"] - frame["rss_before_model_bytes"]
    return growth.where(frame["device"] == "cpu")


def summarize(results: pd.DataFrame) -> pd.DataFrame:
    """One row per comparison group and precision, with speedups and memory savings."""
    frame = results.copy()
    for key in GROUP_KEYS:
        if key not in frame:
            frame[key] = np.nan
    frame[["image_size", "seq_len"]] = frame[["image_size", "seq_len"]].fillna(-1)
    frame["peak_mem_bytes"] = _memory(frame)
    frame["mem_above_baseline_bytes"] = _above_baseline(frame)
    ok = frame[frame["status"] == "ok"]
    medians = ok.groupby(GROUP_KEYS + ["precision"], dropna=False).agg(
        step_time_ms=("step_time_ms_median", "median"),
        throughput=("throughput", "median"),
        peak_mem_bytes=("peak_mem_bytes", "median"),
        mem_above_baseline_bytes=("mem_above_baseline_bytes", "median"),
        repeats_ok=("status", "size"),
    )
    by_case = frame.groupby(GROUP_KEYS + ["precision"], dropna=False)["status"]
    # "ok" only when every repeat was ok; otherwise the commonest failure, with all counts alongside
    statuses = by_case.agg(lambda s: "ok" if (s == "ok").all() else s[s != "ok"].value_counts().index[0])
    counts = by_case.agg(lambda s: ", ".join(f"{v} {k}" for k, v in s.value_counts().items()))
    table = pd.DataFrame({"status": statuses, "status_counts": counts}).join(medians).reset_index()
    table["repeats_ok"] = table["repeats_ok"].fillna(0).astype(int)

    def baseline(precision: str, column: str) -> pd.Series:
        base = table[table["precision"] == precision].set_index(GROUP_KEYS)[column]
        return table.join(base.rename("_base"), on=GROUP_KEYS)["_base"]

    # from median step times (robust to outliers); the throughput ratio includes host gaps between steps
    table["speedup_vs_fp32"] = baseline("fp32", "step_time_ms") / table["step_time_ms"]
    table["throughput_speedup_vs_fp32"] = table["throughput"] / baseline("fp32", "throughput")
    table["speedup_vs_tf32"] = baseline("tf32", "step_time_ms") / table["step_time_ms"]
    table["mem_saving_vs_fp32"] = 1 - table["peak_mem_bytes"] / baseline("fp32", "peak_mem_bytes")
    table["mem_saving_above_baseline_vs_fp32"] = (
        1 - table["mem_above_baseline_bytes"] / baseline("fp32", "mem_above_baseline_bytes"))
    table[["image_size", "seq_len"]] = table[["image_size", "seq_len"]].replace(-1, np.nan)
    order = {p: i for i, p in enumerate(["fp32", "tf32", "amp_fp16", "amp_bf16"])}
    table["_order"] = table["precision"].map(order)
    return table.sort_values(GROUP_KEYS[:7] + ["_order"]).drop(columns="_order").reset_index(drop=True)
