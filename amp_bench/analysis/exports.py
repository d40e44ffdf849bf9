"""Results in the formats the tools teams already gate with: Bencher Metric Format (BMF) JSON and
Apache Otava CSV. Torch-free; both read the rows through the store's one reader.

BMF (`{benchmark: {measure: {value, lower_value, upper_value}}}`, one report per testbed): the
benchmark is SUITE/CASE_ID; per measure the value is the median across repeats and the interval the
widest 95% interval the repeats give (step time: the medians' own intervals; throughput: the same
interval carried over, t = samples/step; memory and energy: the range across repeats). A testbed is
one machine, so a tree with several machines is exported one machine at a time (--machine).

Otava analyses one series per file: one CSV per machine, suite and case, a row per run (time =
the run's start, UTC), attribute columns (machine, suite, case, run, fingerprint, torch), one
column per metric, and an otava.yaml naming every file as a test.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd

from amp_bench import identity
from amp_bench.analysis.speedups import headline_memory
from amp_bench.errors import UserError
from amp_bench.store.flags import text_column
from amp_bench.store.results import load_results

# measure slug -> its unit
MEASURES = {"step-time-ms": "ms", "throughput-samples-per-s": "samples/s", "peak-memory-bytes": "bytes",
            "energy-j-per-sample": "J/sample"}
OTAVA_METRICS = {"step_time_ms": "step_time_ms_median", "throughput": "throughput",  # Otava metric -> column
                 "peak_memory_bytes": "peak_memory_bytes", "energy_j_per_sample": "energy_j_per_sample"}


def machine_names(rows: pd.DataFrame) -> pd.Series:
    """hostname [partition] (the machine a testbed or a series is)."""
    host = text_column(rows, "hostname")
    partition = text_column(rows, "slurm_partition")
    name = host.where(host.ne(""), text_column(rows, "device_name"))
    return name.where(partition.eq(""), name + " [" + partition + "]")


def _ok_rows(path, machine: str | None) -> pd.DataFrame:
    rows = load_results(path)
    rows = rows[rows["status"] == "ok"].copy()
    if rows.empty:
        raise UserError(f"{path}: no ok result to export (every case failed or was not run)")
    rows["machine"] = machine_names(rows)
    if machine is not None:
        chosen = rows[(rows["machine"] == machine) | (text_column(rows, "fingerprint") == machine) |
                      (text_column(rows, "hostname") == machine)]
        if chosen.empty:
            raise UserError(f"--machine {machine!r}: not in {path} (it has: "
                            f"{', '.join(sorted(rows['machine'].unique()))})")
        rows = chosen
    rows["peak_memory_bytes"] = headline_memory(rows)  # the figures are typed on read (load_results)
    return identity.keyed(rows)  # one series: a suite's case (identity.case_keys), named by its case_id


def _interval(value: float, lows: pd.Series, highs: pd.Series) -> dict:
    lo, hi = np.nanmin(lows.to_numpy(dtype=float)), np.nanmax(highs.to_numpy(dtype=float))
    out = {"value": float(value)}
    if np.isfinite(lo) and np.isfinite(hi):
        out.update(lower_value=float(min(lo, value)), upper_value=float(max(hi, value)))
    return out


def to_bmf(path, machine: str | None = None) -> dict:
    """One BMF report of one machine: its newest run of each case (several runs: the newest wins)."""
    rows = _ok_rows(path, machine)
    machines = sorted(rows["machine"].unique())
    if len(machines) > 1:
        raise UserError(f"{path}: holds {len(machines)} machines ({'; '.join(machines)}); Bencher takes one testbed "
                        "per report: pass --machine NAME")
    keys = ["suite", *identity.case_keys()]
    newest = rows.groupby(keys, dropna=False)["run_id"].transform("max")
    rows = rows[rows["run_id"] == newest]
    report = {}
    for _, case in rows.groupby(keys, dropna=False):
        suite, case_id = case["suite"].iloc[0], case["case_id"].iloc[0]
        step = case["step_time_ms_median"]
        low, high = case["step_time_ms_ci_low"].fillna(step), case["step_time_ms_ci_high"].fillna(step)
        measures = {"step-time-ms": _interval(step.median(), low, high)}
        throughput = case["throughput"]
        if throughput.notna().any():  # the median's interval carried over: samples/s falls as the step grows
            measures["throughput-samples-per-s"] = _interval(throughput.median(), throughput * step / high,
                                                              throughput * step / low)
        for slug, column in (("peak-memory-bytes", "peak_memory_bytes"),
                             ("energy-j-per-sample", "energy_j_per_sample")):
            values = case[column].dropna()
            if not values.empty:
                measures[slug] = _interval(values.median(), values, values)
        report[(suite, case_id)] = measures
    return {f"{suite}/{case_id}": measures for (suite, case_id), measures in sorted(report.items())}


def write_bmf(path, output: Path | None, machine: str | None = None) -> str:
    text = json.dumps(to_bmf(path, machine), indent=2) + "\n"
    if output is not None:
        _write(Path(output), text)
    return text


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", str(text)).strip("-").lower() or "x"


def otava_tables(path, machine: str | None = None) -> dict[str, pd.DataFrame]:
    """{test name: its CSV table}: one series (machine, suite, case) each, a row per run, oldest first."""
    rows = _ok_rows(path, machine)
    rows["time"] = pd.to_datetime(rows["run_id"].str.slice(0, 16), format="%Y%m%dT%H%M%SZ", utc=True, errors="coerce")
    rows["time"] = rows["time"].fillna(pd.to_datetime(text_column(rows, "timestamp"), utc=True, errors="coerce"))
    tables = {}
    for _, series in rows.groupby(["machine", "suite", *identity.case_keys()], dropna=False):
        name, suite, case_id = series["machine"].iloc[0], series["suite"].iloc[0], series["case_id"].iloc[0]
        per_run = series.groupby("run_id", sort=False)
        table = pd.DataFrame({
            "time": per_run["time"].min().dt.strftime("%Y-%m-%d %H:%M:%S +0000"),
            "machine": name, "suite": suite, "case": case_id, "run": per_run["run_id"].first(),
            "fingerprint": per_run["fingerprint"].first() if "fingerprint" in series else "",
            "torch": per_run["torch_version"].first() if "torch_version" in series else "",
            **{metric: per_run[column].median() for metric, column in OTAVA_METRICS.items()}}).reset_index(drop=True)
        table = table.dropna(axis=1, how="all").sort_values("time", kind="stable")
        tables[(name, suite, case_id)] = table
    return {".".join(map(_slug, key)): table for key, table in sorted(tables.items())}


def write_otava(path, directory: Path, machine: str | None = None) -> list[Path]:
    """The CSVs and an otava.yaml (`otava analyze --config-file DIR/otava.yaml TEST`) into directory."""
    import yaml
    directory = Path(directory)
    tables = otava_tables(path, machine)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"{directory}: cannot write the export ({exc.strerror or exc})") from None
    tests, written = {}, []
    for name, table in tables.items():
        file = directory / f"{name}.csv"
        _write(file, table.to_csv(index=False))
        written.append(file)
        tests[name] = {"type": "csv", "file": str(file.resolve()), "time_column": "time",
                       "attributes": [c for c in ("machine", "suite", "case", "run", "fingerprint", "torch")
                                      if c in table],
                       "metrics": [m for m in OTAVA_METRICS if m in table]}
    config = directory / "otava.yaml"
    _write(config, yaml.safe_dump({"tests": tests}, sort_keys=False))
    return [config, *written]


def _write(path: Path, text: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UserError(f"{path}: cannot write the export ({exc.strerror or exc})") from None
