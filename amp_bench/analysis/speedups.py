"""Pair every precision with the fp32 (and tf32) baseline of the same model, batch size, layout,
device and run, and compute speedups and memory savings.

A speedup is paired: the run's schedule runs every mode of a group once per repeat, one after the
other rotating which goes first (studies/run_plan.schedule), or, on the CPU, as a lockstep set whose
workers take turns (launchers/lockstep.py), so within a repeat the two modes saw the same machine.
The speedup is exp of the trimmed mean of the per-repeat log ratios of the two modes' median step times, its 95%
interval t on them with Yuen's standard error (analysis/intervals.paired_log_interval, TRIM): a VM whose speed drifts
between repeats moves both sides of a pair alike, and the ratio cancels it; a pair that straddled a steal burst is
trimmed, not averaged in. Memory savings are from the medians across repeats.

This is the plotting-free layer under the CLI table and the report: a precision is only ever
compared with a baseline measured in the same run (same machine, suite and torch), and a missing
or failed baseline gives an empty ratio, never a guess.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from amp_bench import identity, modes
from amp_bench.analysis.intervals import paired_log_interval, trimmed_log_mean
from amp_bench.identity import EAGER, group_keys  # one comparison group: the run and the case's axes
from amp_bench.store.flags import is_true, true_rows

# per case, the compile figures carried into the summary (median over ok repeats; counts: the most)
COMPILE_MEDIANS = ["compile_time_s", "compile_first_step_ms"]
COMPILE_MAXIMA = ["graph_breaks", "recompiles", "recompiles_in_window", "unique_graphs"]
# memory metric -> result column; a metric is summarised only when its column has values
MEMORY_METRICS = {"allocated": "peak_mem_allocated_bytes", "reserved": "peak_mem_reserved_bytes",
                  "rss": "peak_rss_bytes", "rss_above_baseline": "mem_above_baseline_bytes",
                  "nvml": "nvml_mem_used_delta_bytes"}
CARRIED = ["hostname", "architecture", "torch_version", "cuda_version", "compute_capability",
           "slurm_partition"]  # constant within a run


def _prepare(results: pd.DataFrame) -> pd.DataFrame:
    frame = identity.keyed(results)  # a copy: the keys groupable, the defaults of rows written before an axis existed
    for column in CARRIED + ["repeat"] + COMPILE_MEDIANS + COMPILE_MAXIMA:
        if column not in frame:
            frame[column] = np.nan
    if "rss_before_model_bytes" in frame and "peak_rss_bytes" in frame:
        # CPU: peak RSS minus the RSS before the model was built (drops torch's own footprint)
        growth = frame["peak_rss_bytes"] - frame["rss_before_model_bytes"]
        frame["mem_above_baseline_bytes"] = growth.where(frame["device"] == "cpu")
    frame["peak_mem_bytes"] = headline_memory(frame)
    return frame


def speedup_text(point, low=None, high=None) -> str:
    """'1.66x (1.61-1.72)': a speedup with its 95% interval where it has one; '-' without a figure.
    The one way every table prints a speedup."""
    def finite(value) -> bool:
        try:
            return np.isfinite(float(value))
        except (TypeError, ValueError):
            return False
    if not finite(point):
        return "-"
    text = f"{float(point):.2f}x"
    if finite(low) and finite(high) and float(low) != float(high):
        text += f" ({float(low):.2f}-{float(high):.2f})"
    return text


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
    keys = group_keys() + ["precision"]
    ok = frame[frame["status"] == "ok"]
    metrics = {"peak_mem_bytes": "peak_mem_bytes"} | {f"mem_{m}_bytes": c for m, c in MEMORY_METRICS.items()
                                                      if c in frame and frame[c].notna().any()}
    aggregations = {"step_time_ms": ("step_time_ms_median", "median"), "throughput": ("throughput", "median"),
                    "repeats_ok": ("status", "size")}
    aggregations |= {name: (column, "median") for name, column in metrics.items()}
    aggregations |= {c: (c, "median") for c in COMPILE_MEDIANS} | {c: (c, "max") for c in COMPILE_MAXIMA}
    medians = clean_rows(ok, keys).groupby(keys, dropna=False).agg(**aggregations)
    by_case = frame.groupby(keys, dropna=False)
    # "ok" when every repeat was ok, or when the others were only contended (left out of the figures) and
    # MIN_CLEAN_PAIRS ok remain; otherwise the commonest failure, with all counts alongside
    statuses = by_case["status"].agg(_case_status)
    counts = by_case["status"].agg(lambda s: ", ".join(f"{v} {k}" for k, v in s.value_counts().items()))
    reasons = by_case["reason"].agg(lambda s: next((r for r in s if isinstance(r, str) and r), "")) \
        if "reason" in frame else pd.Series("", index=statuses.index)
    table = pd.DataFrame({"status": statuses, "status_counts": counts, "reason": reasons}) \
        .join(by_case[CARRIED].first()).join(_flags(frame, keys)).join(medians).reset_index()
    table["repeats_ok"] = table["repeats_ok"].fillna(0).astype(int)

    def baseline(precision: str, column: str) -> pd.Series:
        base = table[table["precision"] == precision].set_index(group_keys())[column]
        return table.join(base.rename("_base"), on=group_keys())["_base"]

    ref = modes.reference()  # memory savings and the throughput ratio are given against it only
    for base in modes.baseline_names():
        # paired per repeat (the module's docstring); where no repeat has both modes ok, the ratio of
        # the medians across repeats, without an interval
        table = table.join(paired_speedups(ok, base, throughput=base == ref), on=keys)
        unpaired = baseline(base, "step_time_ms") / table["step_time_ms"]
        table[f"speedup_vs_{base}"] = table[f"speedup_vs_{base}"].fillna(unpaired)
        table = _dropped_pairs(table, frame, base)
    unpaired = table["throughput"] / baseline(ref, "throughput")
    table[f"throughput_speedup_vs_{ref}"] = table[f"throughput_speedup_vs_{ref}"].fillna(unpaired)
    table[f"mem_saving_vs_{ref}"] = 1 - table["peak_mem_bytes"] / baseline(ref, "peak_mem_bytes")
    for name in metrics:
        if name != "peak_mem_bytes":
            metric = name[len("mem_"):-len("_bytes")]
            table[f"mem_saving_{metric}_vs_{ref}"] = 1 - table[name] / baseline(ref, name)
    # the CLI's name for the rss_above_baseline saving
    table[f"mem_saving_above_baseline_vs_{ref}"] = table.get(f"mem_saving_rss_above_baseline_vs_{ref}", np.nan)
    table = _scaling_efficiency(table)
    table = _versus_eager(table)
    table = identity.unkeyed(table)
    table["_order"] = table["precision"].map(modes.order_key)
    return table.sort_values(group_keys() + ["_order"]).drop(columns="_order").reset_index(drop=True)


def clean_rows(ok: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Each case's ok rows that ran on their own machine, where MIN_CLEAN_PAIRS such remain (else all its ok
    rows): the medians are taken as the paired speedups are, without the contended repeats."""
    busy = true_rows(ok["contended"]) if "contended" in ok else pd.Series(False, index=ok.index)
    clean_count = (~busy).groupby([ok[k] for k in keys], dropna=False).transform("sum")
    return ok[~busy | (clean_count < MIN_CLEAN_PAIRS)]


def _case_status(statuses: pd.Series) -> str:
    """A case's status across its repeats (module docstring of summarize's)."""
    if (statuses == "ok").all():
        return "ok"
    failed = statuses[statuses != "ok"]
    if (failed == "contended").all() and (statuses == "ok").sum() >= MIN_CLEAN_PAIRS:
        return "ok"
    return failed.value_counts().index[0]


def _dropped_pairs(table: pd.DataFrame, frame: pd.DataFrame, base: str) -> pd.DataFrame:
    """The pairs a disturbance cost each speedup over `base`: those left out because a side ran contended,
    and those a contended stop broke (a side without figures); `contended_vs_<base>` when what is left
    cannot carry the figure (fewer than MIN_CLEAN_PAIRS clean pairs of a run that planned more)."""
    name = f"speedup_vs_{base}"
    stopped = frame.assign(_stopped=frame["status"] == "contended")  # any: merged runs may repeat a precision
    broken = stopped.groupby(group_keys() + ["repeat", "precision"], dropna=False)["_stopped"].any().unstack(
        "precision", fill_value=False)
    counts = {}
    if base in broken:
        either = broken.apply(lambda col: col | broken[base])
        counts = either.groupby(level=group_keys(), dropna=False).sum().stack().to_dict()
    lost = [counts.get((*key, precision), 0) for key, precision in
            zip(table[group_keys()].itertuples(index=False, name=None), table["precision"], strict=True)]
    dropped = table[f"{name}_dropped"].fillna(0).astype(int) + np.asarray(lost, dtype=int)
    table[f"{name}_dropped"] = dropped.where(table["status"] == "ok", 0)  # a case without figures drops nothing
    pairs = table[f"{name}_pairs"].fillna(0)
    too_few = (pairs < MIN_CLEAN_PAIRS) & (pairs + table[f"{name}_dropped"] >= MIN_CLEAN_PAIRS) & \
        (table[f"{name}_dropped"] > 0)
    table[f"contended_vs_{base}"] = (table[f"{name}_busy"].eq(True) | too_few) & (table["precision"] != base)
    return table.drop(columns=[f"{name}_busy"])


def _versus_eager(table: pd.DataFrame) -> pd.DataFrame:
    """Compiled against eager, in the same run and group: speedup over fp32 eager, speedup over the
    same precision eager, and the break-even steps, compile_time_s / (eager step - compiled step):
    after that many steps the compile time has paid for itself (empty when compiled is not faster)."""
    keys = [k for k in group_keys() if k != "compile_mode"]
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
    1.0 is perfect scaling; a world size without a one-process baseline gets no value. The one-process
    baseline is DDP with one process where the run has it (the same code path), else the plain process."""
    keys = [k for k in group_keys() if k not in ("world_size", "nproc_per_node")] + ["precision"]
    ones = table[table["world_size"] == 1].assign(_plain=lambda t: t["nproc_per_node"] < 1)  # keyed: -1 plain
    plain_first = ones.sort_values("_plain", kind="stable").drop_duplicates(keys)
    base = plain_first.set_index(keys)[["step_time_ms", "throughput"]]
    joined = table.join(base.rename(columns=lambda c: f"_{c}_1"), on=keys)
    table["scaling_efficiency"] = joined["_step_time_ms_1"] / table["step_time_ms"]
    table["throughput_scaling_efficiency"] = table["throughput"] / (table["world_size"] * joined["_throughput_1"])
    return table


def _flags(frame: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Per case: whether the mode ran emulated (and why), and whether any repeat was contended (and
    how): the labels every table and chart shows beside the number."""
    columns = {"emulated": False, "emulated_reason": "", "contended": False, "contention": ""}
    frame = frame.assign(**{c: frame.get(c, default) for c, default in columns.items()})

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


def paired_log_ratios(ok: pd.DataFrame, base: str) -> pd.DataFrame:
    """Per ok row that has its repeat's `base` row beside it: the log of the pair's step-time ratio
    (`_log`: base median / this median), of its throughput ratio (`_tlog`), whether either side was
    contended (`_busy`), and the base side's interval columns (`_base_*`). group_keys() + precision +
    repeat identify a pair: the two modes ran in that repeat, one after the other or in lockstep."""
    ok = identity.keyed(ok)
    keys = pair_keys(ok) + ["repeat"]
    sides = ["step_time_ms_median", "step_time_ms_ci_low", "step_time_ms_ci_high", "throughput", "contended",
             "interleave", "worker_window"]
    ok = ok.assign(**{c: ok.get(c, np.nan) for c in sides})
    base_side = ok[ok["precision"] == base].set_index(keys)[sides].rename(columns=lambda c: f"_base_{c}")
    paired = ok.join(base_side, on=keys)
    paired["_log"] = np.log(paired["_base_step_time_ms_median"] / paired["step_time_ms_median"])
    paired["_tlog"] = np.log(paired["throughput"] / paired["_base_throughput"])
    paired["_busy"] = [is_true(a) or is_true(b)
                       for a, b in zip(paired["contended"], paired["_base_contended"], strict=True)]
    return paired.dropna(subset=["_log"])


def pair_keys(rows: pd.DataFrame) -> list[str]:
    """What makes two (keyed) rows one comparison group: identity's group keys, the run and the case's
    axes; and the group_id every run writes, which keeps apart rows written by hand without the axes."""
    return group_keys() + (["group_id"] if "group_id" in rows and rows["group_id"].notna().all() else [])


MIN_CLEAN_PAIRS = 2  # a paired interval needs two pairs; fewer clean ones and contended pairs stay in, flagged


def clean_pairs(pairs: pd.DataFrame) -> pd.DataFrame:
    """The pairs where neither side was contended, while MIN_CLEAN_PAIRS such remain; else all of them."""
    clean = pairs[~pairs["_busy"]]
    return clean if len(clean) >= MIN_CLEAN_PAIRS else pairs


def paired_speedups(ok: pd.DataFrame, base: str, throughput: bool = False) -> pd.DataFrame:
    """Per group and precision: the paired speedup over `base` (the module's docstring), its interval
    and how it was got, the lowest and highest per-repeat ratio and the number of pairs; with
    `throughput`, the paired throughput ratio too. Contended pairs are left out while two clean pairs
    remain. One pair has the interval its two windows' 95% intervals of the median allow (base low /
    mode high .. base high / mode low)."""
    rows = {key: _paired_row(pairs, base, throughput)
            for key, pairs in paired_log_ratios(ok, base).groupby(group_keys() + ["precision"], dropna=False)}
    # (grouped by the summary's columns, which _prepare made key-safe: one group id is one such group)
    index = pd.MultiIndex.from_tuples(list(rows), names=group_keys() + ["precision"])
    columns = [f"speedup_vs_{base}", f"speedup_vs_{base}_ci_low", f"speedup_vs_{base}_ci_high",
               f"speedup_vs_{base}_min", f"speedup_vs_{base}_max", f"speedup_vs_{base}_pairs",
               f"speedup_vs_{base}_method", f"speedup_vs_{base}_dropped", f"speedup_vs_{base}_clean",
               f"speedup_vs_{base}_busy"] + ([f"throughput_speedup_vs_{base}"] if throughput else [])
    return pd.DataFrame(list(rows.values()), index=index, columns=columns)


def _how_paired(pairs: pd.DataFrame) -> str:
    """', in lockstep' when both rows of every pair say their repeat's modes took turns (launchers/lockstep.py);
    ', windows of one worker per mode' when repeats shared a worker (repeats_per_worker): such pairs do not
    see the spread between processes (cuDNN's choice of algorithms, allocator state), only within one."""
    sides = pd.concat([pairs["interleave"], pairs["_base_interleave"]])
    how = ", in lockstep" if len(sides) and (sides == "steps").all() else ""
    windows = pd.concat([pairs["worker_window"], pairs["_base_worker_window"]]).astype(float)
    return how + (", windows of one worker per mode" if (windows > 0).any() else "")


def _paired_row(every: pd.DataFrame, base: str, throughput: bool) -> dict:
    """The paired speedup from the clean pairs (clean_pairs), how many were dropped, whether busy ones stayed."""
    name = f"speedup_vs_{base}"
    pairs = clean_pairs(every)
    ratios = np.exp(pairs["_log"])
    found = paired_log_interval(pairs["_log"])
    if (pairs["precision"] == base).all():  # the baseline against itself
        point, low, high, method = 1.0, 1.0, 1.0, "the baseline itself"
    elif found is not None:
        point, low, high = found
        method = f"paired, trimmed t on log ratios ({len(pairs)} repeats{_how_paired(pairs)})"
    else:  # one pair
        one = pairs.iloc[0]
        point = float(ratios.iloc[0])
        low = one["_base_step_time_ms_ci_low"] / one["step_time_ms_ci_high"]
        high = one["_base_step_time_ms_ci_high"] / one["step_time_ms_ci_low"]
        method = "one pair: its windows' 95% intervals of the median"
    row = {name: point, f"{name}_ci_low": low, f"{name}_ci_high": high, f"{name}_min": float(ratios.min()),
           f"{name}_max": float(ratios.max()), f"{name}_pairs": len(pairs), f"{name}_method": method,
           f"{name}_dropped": len(every) - len(pairs), f"{name}_clean": int((~every["_busy"]).sum()),
           f"{name}_busy": bool(pairs["_busy"].any())}
    if throughput:
        row[f"throughput_{name}"] = trimmed_log_mean(pairs["_tlog"].dropna())
    return row
