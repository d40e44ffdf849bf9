"""Pair every precision with the fp32 (and tf32) baseline of the same model, batch size, layout,
device and run, and compute speedups and memory savings from medians across repeats.

This is the plotting-free layer under the CLI table and the report: a precision is only ever
compared with a baseline measured in the same run (same machine, suite and torch), and a missing
or failed baseline gives an empty ratio, never a guess.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from amp_bench import modes
from amp_bench.store.flags import is_true, true_rows

GROUP_KEYS = ["run_id", "suite", "model_label", "batch_size", "image_size", "seq_len", "channels_last", "device",
              "device_name", "world_size", "compile_mode"]  # a compile mode is paired within itself
EAGER = "eager"  # the compile_mode of an eager case (suite.schema.EAGER; this module stays free of the suite layer)
# per case, the compile figures carried into the summary (median over ok repeats; counts: the most)
COMPILE_MEDIANS = ["compile_time_s", "compile_first_step_ms"]
COMPILE_MAXIMA = ["graph_breaks", "recompiles", "recompiles_in_window", "unique_graphs"]
# memory metric -> result column; a metric is summarised only when its column has values
MEMORY_METRICS = {
    "allocated": "peak_mem_allocated_bytes",
    "reserved": "peak_mem_reserved_bytes",
    "rss": "peak_rss_bytes",
    "rss_above_baseline": "mem_above_baseline_bytes",
    "nvml": "nvml_mem_used_delta_bytes",
}
CARRIED = ["hostname", "architecture", "torch_version", "cuda_version", "compute_capability",
           "slurm_partition"]  # constant within a run


def _prepare(results: pd.DataFrame) -> pd.DataFrame:
    frame = results.copy()
    for key in GROUP_KEYS + CARRIED + ["repeat"]:
        if key not in frame:
            frame[key] = np.nan
    frame[["image_size", "seq_len"]] = frame[["image_size", "seq_len"]].fillna(-1)
    frame["world_size"] = frame["world_size"].fillna(1)  # results from before DDP: one process
    frame["compile_mode"] = frame["compile_mode"].astype(object).fillna(EAGER)  # results from before compile: eager
    for column in COMPILE_MEDIANS + COMPILE_MAXIMA:
        frame[column] = pd.to_numeric(frame[column], errors="coerce") if column in frame else np.nan
    if "rss_before_model_bytes" in frame and "peak_rss_bytes" in frame:
        # CPU: peak RSS minus the RSS before the model was built (drops torch's own footprint)
        growth = frame["peak_rss_bytes"] - frame["rss_before_model_bytes"]
        frame["mem_above_baseline_bytes"] = growth.where(frame["device"] == "cpu")
    frame["peak_mem_bytes"] = headline_memory(frame)
    return frame


def headline_memory(frame: pd.DataFrame) -> pd.Series:
    """The memory figure compared everywhere: the allocator's peak on GPUs, the worker's peak RSS
    on the CPU."""
    cuda = frame.get("peak_mem_allocated_bytes", pd.Series(np.nan, index=frame.index))
    rss = frame.get("peak_rss_bytes", pd.Series(np.nan, index=frame.index))
    return cuda.where(frame["device"] == "cuda", rss)


def summarize(results: pd.DataFrame) -> pd.DataFrame:
    """One row per comparison group and precision, with speedups (and their spread across repeats)
    and memory savings per metric."""
    frame = _prepare(results)
    keys = GROUP_KEYS + ["precision"]
    ok = frame[frame["status"] == "ok"]
    metrics = {"peak_mem_bytes": "peak_mem_bytes"} | {f"mem_{m}_bytes": c for m, c in MEMORY_METRICS.items()
                                                      if c in frame and frame[c].notna().any()}
    aggregations = {"step_time_ms": ("step_time_ms_median", "median"), "throughput": ("throughput", "median"),
                    "repeats_ok": ("status", "size")}
    aggregations |= {name: (column, "median") for name, column in metrics.items()}
    aggregations |= {c: (c, "median") for c in COMPILE_MEDIANS} | {c: (c, "max") for c in COMPILE_MAXIMA}
    medians = ok.groupby(keys, dropna=False).agg(**aggregations)
    by_case = frame.groupby(keys, dropna=False)
    # "ok" only when every repeat was ok; otherwise the commonest failure, with all counts alongside
    statuses = by_case["status"].agg(lambda s: "ok" if (s == "ok").all() else s[s != "ok"].value_counts().index[0])
    counts = by_case["status"].agg(lambda s: ", ".join(f"{v} {k}" for k, v in s.value_counts().items()))
    reasons = by_case["reason"].agg(lambda s: next((r for r in s if isinstance(r, str) and r), "")) \
        if "reason" in frame else pd.Series("", index=statuses.index)
    carried = by_case[CARRIED].first()
    flags = _flags(frame, keys)
    table = pd.DataFrame({"status": statuses, "status_counts": counts, "reason": reasons}) \
        .join(carried).join(flags).join(medians).reset_index()
    table["repeats_ok"] = table["repeats_ok"].fillna(0).astype(int)

    def baseline(precision: str, column: str) -> pd.Series:
        base = table[table["precision"] == precision].set_index(GROUP_KEYS)[column]
        return table.join(base.rename("_base"), on=GROUP_KEYS)["_base"]

    for base in modes.baseline_names():
        # from median step times (robust to outliers); the throughput ratio includes host gaps
        table[f"speedup_vs_{base}"] = baseline(base, "step_time_ms") / table["step_time_ms"]
        low, high, pairs, ci_low, ci_high = _repeat_spread(ok, base)
        table = table.join(pd.DataFrame({f"speedup_vs_{base}_min": low, f"speedup_vs_{base}_max": high,
                                         f"speedup_vs_{base}_pairs": pairs, f"speedup_vs_{base}_ci_low": ci_low,
                                         f"speedup_vs_{base}_ci_high": ci_high}), on=keys)
        # a ratio is only as trustworthy as both its sides
        both = zip(table["contended"], baseline(base, "contended"))
        table[f"contended_vs_{base}"] = [is_true(a) or is_true(b) for a, b in both]
    ref = modes.reference()  # memory savings and the throughput ratio are given against it only
    table[f"throughput_speedup_vs_{ref}"] = table["throughput"] / baseline(ref, "throughput")
    table[f"mem_saving_vs_{ref}"] = 1 - table["peak_mem_bytes"] / baseline(ref, "peak_mem_bytes")
    for name in metrics:
        if name != "peak_mem_bytes":
            metric = name[len("mem_"):-len("_bytes")]
            table[f"mem_saving_{metric}_vs_{ref}"] = 1 - table[name] / baseline(ref, name)
    if f"mem_saving_rss_above_baseline_vs_{ref}" in table:  # the CLI's name for it
        table[f"mem_saving_above_baseline_vs_{ref}"] = table[f"mem_saving_rss_above_baseline_vs_{ref}"]
    else:
        table[f"mem_saving_above_baseline_vs_{ref}"] = np.nan
    table = _scaling_efficiency(table)
    table = _versus_eager(table)
    table[["image_size", "seq_len"]] = table[["image_size", "seq_len"]].replace(-1, np.nan)
    table["_order"] = table["precision"].map(modes.order_key)
    return table.sort_values(GROUP_KEYS[:7] + ["world_size", "compile_mode", "_order"]).drop(columns="_order").reset_index(drop=True)


def _versus_eager(table: pd.DataFrame) -> pd.DataFrame:
    """Compiled against eager, in the same run and group: speedup over fp32 eager, speedup over the
    same precision eager, and the break-even steps, compile_time_s / (eager step - compiled step):
    after that many steps the compile time has paid for itself (empty when compiled is not faster)."""
    keys = [k for k in GROUP_KEYS if k != "compile_mode"]
    eager = table[table["compile_mode"] == EAGER]
    same = table.join(eager.set_index(keys + ["precision"])["step_time_ms"].rename("_eager"), on=keys + ["precision"])
    ref = modes.reference()
    base = table.join(eager[eager["precision"] == ref].set_index(keys)["step_time_ms"].rename("_ref"), on=keys)
    table["speedup_vs_eager"] = same["_eager"] / table["step_time_ms"]
    table[f"speedup_vs_{ref}_eager"] = base["_ref"] / table["step_time_ms"]
    saved_ms = same["_eager"] - table["step_time_ms"]
    table["break_even_steps"] = (table["compile_time_s"] * 1e3 / saved_ms).where(saved_ms > 0)
    return table


def _scaling_efficiency(table: pd.DataFrame) -> pd.DataFrame:
    """Weak-scaling efficiency of N processes against the same case (same precision) with one process
    in the same run: T1 * N / TN with T the time per sample, i.e.
        scaling_efficiency = step_time_1 / step_time_N        (from median step times, as speedups are)
        throughput_scaling_efficiency = throughput_N / (N * throughput_1)   (includes host gaps)
    1.0 is perfect scaling; a world size without a one-process baseline gets no value."""
    keys = [k for k in GROUP_KEYS if k != "world_size"] + ["precision"]
    base = table[table["world_size"] == 1].set_index(keys)[["step_time_ms", "throughput"]]
    joined = table.join(base.rename(columns=lambda c: f"_{c}_1"), on=keys)
    table["scaling_efficiency"] = joined["_step_time_ms_1"] / table["step_time_ms"]
    table["throughput_scaling_efficiency"] = table["throughput"] / (table["world_size"] * joined["_throughput_1"])
    return table


def _flags(frame: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Per case: whether the mode ran emulated (and why), and whether any repeat was contended (and
    how): the labels every table and chart shows beside the number."""
    columns = {"emulated": False, "emulated_reason": "", "contended": False, "contention": ""}
    frame = frame.assign(**{c: frame[c] if c in frame else default for c, default in columns.items()})

    def anyof(values: pd.Series):
        known = values.dropna()
        return bool(true_rows(known).any()) if len(known) else np.nan

    def first_text(values: pd.Series) -> str:
        return next((v for v in values if isinstance(v, str) and v), "")

    def first_reason(values: pd.Series) -> str:  # a contended repeat's reason before another's "unknown (...)"
        texts = [v for v in values if isinstance(v, str) and v]
        return next((v for v in texts if not v.startswith("unknown")), texts[0] if texts else "")
    grouped = frame.groupby(keys, dropna=False)
    return pd.DataFrame({"emulated": grouped["emulated"].agg(anyof), "emulated_reason": grouped["emulated_reason"]
                         .agg(first_text), "contended": grouped["contended"].agg(anyof),
                         "contention": grouped["contention"].agg(first_reason)})


def _repeat_spread(ok: pd.DataFrame, base: str) -> tuple[pd.Series, ...]:
    """Min and max of the per-repeat speedups, pairing repeat r of the baseline with repeat r of
    the mode (they ran interleaved, next to each other); and the interval that also covers each
    pair's 95% intervals of the median (base low / mode high .. base high / mode low)."""
    keys = GROUP_KEYS + ["repeat"]
    columns = ["step_time_ms_median", "step_time_ms_ci_low", "step_time_ms_ci_high"]
    ok = ok.assign(**{c: ok[c] if c in ok else np.nan for c in columns})
    base_times = ok[ok["precision"] == base].set_index(keys)[columns].rename(columns=lambda c: f"_base_{c}")
    paired = ok.join(base_times, on=keys)
    paired["_ratio"] = paired["_base_step_time_ms_median"] / paired["step_time_ms_median"]
    paired["_low"] = paired["_base_step_time_ms_ci_low"] / paired["step_time_ms_ci_high"]
    paired["_high"] = paired["_base_step_time_ms_ci_high"] / paired["step_time_ms_ci_low"]
    grouped = paired.dropna(subset=["_ratio"]).groupby(GROUP_KEYS + ["precision"], dropna=False)
    return (grouped["_ratio"].min(), grouped["_ratio"].max(), grouped["_ratio"].size(),
            grouped["_low"].min(), grouped["_high"].max())
