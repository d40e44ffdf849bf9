"""GPUs compared: the same cases on several GPUs (partitions of a cluster, or runs merged from several
machines), per model and batch, with GPUs as rows and precision modes as columns. Torch-free.

For each GPU and mode: samples/s, the speedup over fp32 *on that GPU* (the summary's, from the same
run), samples/s per watt (= samples per joule, from NVML energy), MFU, and, with a price file, samples
per dollar (samples/s x 3600 / the GPU-hour price x GPUs used). A mode the GPU cannot run (bf16 on a
Volta, fp8 below Ada) is `unsupported` with the gate's reason, never a zero; a mode its run did not
list is absent. `reference_view` divides each GPU's samples/s by one GPU's, mode by mode.

A GPU is its device name and architecture, plus the SLURM partition where there is one (two
partitions of one node type are kept apart); the nodes of one partition are pooled. Where a GPU has
several runs of a case, its newest run is the one compared.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from amp_bench import identity, modes
from amp_bench.analysis.speedups import speedup_text
from amp_bench.errors import UserError
from amp_bench.platform.gpu_specs import architecture, by_key
from amp_bench.store.flags import is_true, text_column

ARCH_ORDER = ["Pascal", "Volta", "Turing", "Ampere", "Ada", "Hopper", "Blackwell", "CPU"]
_FIGURES = ["gpu", "architecture", "compute_capability", "precision", "status", "reason", "throughput",
            "speedup_vs_reference_mode", "speedup_ci_low", "speedup_ci_high", "speedup_pairs_dropped",
            "samples_per_watt", "mfu", "price_per_gpu_hour", "samples_per_dollar", "run_id", "predicted"]
PREDICTED = " (predicted)"  # a predicted GPU's label ends so: it never reads as a measured one


def columns() -> list[str]:
    """compare_gpus' columns: the case, its axes (read when asked: an axis added later is one of them), the figures."""
    return ["case", *identity.case_axes(), *_FIGURES]


def gpu_label(frame: pd.DataFrame) -> pd.Series:
    """'NVIDIA H100 80GB HBM3 (Hopper) [h100]': a GPU type, without the node (a partition's nodes pool)."""
    name, arch = text_column(frame, "device_name"), text_column(frame, "architecture")
    name = name.where(name.ne(""), "?")
    label = name.where(arch.eq("") | arch.eq("CPU"), name + " (" + arch + ")")
    partition = text_column(frame, "slurm_partition")
    return label.where(partition.eq(""), label + " [" + partition + "]")


def load_prices(path: str | Path) -> dict[str, float]:
    """A YAML mapping of GPU (a device name, a part of one such as 'H100', or a partition) to its price
    per GPU-hour. No prices are built in: they differ by cloud, contract and year."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{path}: price file not found") from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise UserError(f"{path}: unreadable price file ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict) or not data:
        raise UserError(f"{path}: expected a mapping of GPU name to price per GPU-hour (e.g. 'H100: 2.49')")
    prices = {}
    for key, value in data.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise UserError(f"{path}: {key}: expected a price per GPU-hour above 0, got {value!r}")
        prices[str(key)] = float(value)
    return prices


def price_for(device_name: str, partition: str, prices: dict[str, float]) -> float | None:
    """The exact device name or partition first; else the longest key found in the device name."""
    for key in (device_name, partition):
        if key and key in prices:
            return prices[key]
    lowered = device_name.lower()
    found = [k for k in prices if k.lower() in lowered]
    return prices[max(found, key=len)] if found else None


def _medians(results: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    ok = identity.keyed(results[results["status"] == "ok"])
    present = [c for c in columns if c in ok]  # typed on read
    return ok.groupby(identity.group_keys() + ["precision"], dropna=False)[present].median().reindex(columns=columns)


def compare_gpus(summary: pd.DataFrame, results: pd.DataFrame, prices: dict[str, float] | None = None) -> pd.DataFrame:
    """One row per case (model, batch, sizes, layout, processes, compile mode), GPU and mode (columns())."""
    if summary.empty:
        return pd.DataFrame(columns=columns())
    table = summary.copy()
    table["gpu"] = gpu_label(table)
    extra = _medians(results, ["samples_per_joule", "mfu"])
    keyed = identity.keyed(table)  # keys as _medians groups them
    table[["samples_per_joule", "mfu"]] = keyed[identity.group_keys() + ["precision"]].join(
        extra, on=identity.group_keys() + ["precision"])[["samples_per_joule", "mfu"]]
    # the newest run of each case on each GPU (run ids start with their UTC time)
    newest = keyed.groupby(["gpu", *identity.case_axes()], dropna=False)["run_id"].transform("max")
    table = table[table["run_id"] == newest].copy()
    ref = modes.reference()
    out = pd.DataFrame({
        **{k: table[k] for k in identity.case_axes()}, "gpu": table["gpu"],
        "architecture": text_column(table, "architecture"),
        "compute_capability": text_column(table, "compute_capability"),
        "precision": table["precision"], "status": table["status"], "reason": text_column(table, "reason"),
        "throughput": table["throughput"].where(table["status"] == "ok"),
        "speedup_vs_reference_mode": table.get(f"speedup_vs_{ref}"),
        "speedup_ci_low": table.get(f"speedup_vs_{ref}_ci_low"),
        "speedup_ci_high": table.get(f"speedup_vs_{ref}_ci_high"),
        "speedup_pairs_dropped": table.get(f"speedup_vs_{ref}_dropped"),  # contended pairs left out of it
        "samples_per_watt": table["samples_per_joule"], "mfu": table["mfu"], "run_id": table["run_id"]})
    device = text_column(table, "device_name")
    partition = text_column(table, "slurm_partition")
    out["price_per_gpu_hour"] = pd.Series([price_for(d, p, prices) if prices else None for d, p in
                                           zip(device, partition, strict=True)], index=out.index, dtype=float)
    gpus = out["world_size"]  # keyed in the summary: 1 where a run said nothing
    out["samples_per_dollar"] = out["throughput"] * 3600 / (out["price_per_gpu_hour"] * gpus)
    out["case"] = identity.case_labels(out)
    rank = out["architecture"].map({a: i for i, a in enumerate(ARCH_ORDER)}).fillna(len(ARCH_ORDER))
    out = out.assign(_rank=rank, _mode=out["precision"].map(modes.order_key))
    out = out.sort_values(["case", "_rank", "gpu", "_mode"], kind="stable").drop(columns=["_rank", "_mode"])
    return out.assign(predicted=False).reindex(columns=columns()).reset_index(drop=True)


def with_predictions(table: pd.DataFrame, predicted: pd.DataFrame) -> pd.DataFrame:
    """The measured GPUs and, after them, the GPUs a run predicted (its predicted.csv), each labelled
    PREDICTED and marked `predicted`: the report draws them apart, and no gate or export reads them."""
    if predicted.empty:
        return table
    specs = [by_key()[target] for target in predicted["target"]]
    rows = pd.DataFrame({
        "case": predicted["case"], "gpu": predicted["target_label"] + PREDICTED,
        "architecture": [architecture(spec.capability) for spec in specs],
        "compute_capability": [".".join(map(str, spec.capability)) for spec in specs],
        "precision": predicted["precision"], "status": predicted["status"],
        "reason": predicted["reason"].fillna(""), "throughput": predicted["throughput"],
        "speedup_vs_reference_mode": predicted["speedup"], "speedup_ci_low": predicted["speedup_low"],
        "speedup_ci_high": predicted["speedup_high"], "predicted": True})
    return pd.concat([table, rows.reindex(columns=columns())], ignore_index=True)



def find_gpu(table: pd.DataFrame, name: str) -> str:
    """The GPU label a --reference names (its exact label, or a unique one containing it)."""
    labels = list(dict.fromkeys(table["gpu"]))
    if name in labels:
        return name
    found = [g for g in labels if name.lower() in g.lower()]
    if len(found) == 1:
        return found[0]
    if not found:
        raise UserError(f"--reference {name!r}: no such GPU in these results (they have: {'; '.join(labels)})")
    raise UserError(f"--reference {name!r}: matches {len(found)} GPUs ({'; '.join(found)}): name one of them fully")


def reference_view(table: pd.DataFrame, reference: str) -> pd.DataFrame:
    """Each GPU's samples/s over the reference GPU's, per case and mode (`vs_reference`); empty where
    either side has no measurement, with `note` saying which."""
    gpu = find_gpu(table, reference)
    ref = table[table["gpu"] == gpu].set_index(["case", "precision"])
    out = table[["case", "gpu", "precision", "status", "throughput"]].copy()
    keys = list(zip(out["case"], out["precision"], strict=True))
    theirs = pd.Series([ref["throughput"].get(k, np.nan) for k in keys], index=out.index)
    their_status = pd.Series([ref["status"].get(k, "not run") for k in keys], index=out.index)
    out["reference"] = gpu
    out["vs_reference"] = out["throughput"] / theirs
    here = np.where(out["status"] == "unsupported", "not supported here", out["status"].astype(str) + " here")
    there = np.where(their_status == "unsupported", "not supported on the reference",
                     "not measured on the reference (" + their_status.astype(str) + ")")
    out["note"] = np.where(out["throughput"].isna(), here, np.where(theirs.isna(), there, ""))
    return out


def pivot_cells(table: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Per case: GPUs as rows, modes as columns, each cell a few lines of text (what the report draws)."""
    out = {}
    order = modes.order()
    for case, group in table.groupby("case", sort=False):
        modes_here = sorted(group["precision"].unique(), key=lambda m: order.index(m) if m in order else len(order))
        rows = []
        for gpu, per_gpu in group.groupby("gpu", sort=False):
            by_mode = {r["precision"]: r for _, r in per_gpu.iterrows()}
            rows.append({"GPU": gpu, **{mode: cell_text(by_mode.get(mode)) for mode in modes_here}})
        out[case] = pd.DataFrame(rows)
    return out


def _si(value: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{unit}"
    return f"{value:.3g}"


def cell_text(row) -> str:
    if row is None:
        return "not run"
    if is_true(row.get("predicted")):
        return _predicted_text(row)
    if row["status"] == "unsupported":
        return f"not supported here: {row['reason']}" if row["reason"] else "not supported here"
    if row["status"] != "ok" or not np.isfinite(row["throughput"] if row["throughput"] is not None else np.nan):
        return f"{row['status']}" + (f": {row['reason']}" if row["reason"] else "")
    parts = [f"{row['throughput']:,.1f} samples/s"]
    if pd.notna(row["speedup_vs_reference_mode"]):  # paired on that GPU, with its 95% interval
        speedup = speedup_text(row["speedup_vs_reference_mode"], row.get("speedup_ci_low"), row.get("speedup_ci_high"))
        parts.append(f"{speedup} vs {modes.reference()}")
    if pd.notna(row["samples_per_watt"]):
        parts.append(f"{row['samples_per_watt']:.3g} samples/s per W")
    if pd.notna(row["mfu"]):
        parts.append(f"MFU {row['mfu']:.1%}")
    if pd.notna(row["samples_per_dollar"]):
        parts.append(f"{_si(row['samples_per_dollar'])} samples per $")
    return " · ".join(parts)


def _predicted_text(row) -> str:
    if row["status"] != "ok":
        return f"predicted {row['status']}: {row['reason']}" if row["reason"] else f"predicted {row['status']}"
    text = f"predicted: ~{row['throughput']:,.0f} samples/s"
    if pd.notna(row["speedup_vs_reference_mode"]):
        text += " · " + speedup_text(row["speedup_vs_reference_mode"], row.get("speedup_ci_low"),
                                     row.get("speedup_ci_high")) + f" vs {modes.reference()}"
    return text
