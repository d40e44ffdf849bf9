"""Builds the real readings tests/data/advice/ holds for the advice rules' tests (its README says where each is from).

    python benchmarks/advice_fixtures.py probe RUN_DIR LABEL...  # cases of a run with the shape probe's readings

probe: the named models' first repeat as STEM.row.json (the row's columns advice reads), with the files its
worker saved beside the trace as they are (the layers, the shape probe's readings, oneDNN's verbose step
gzipped); no trace.
"""
from __future__ import annotations

import gzip
import json
import shutil
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "advice"


def _row(row: dict, stem: str) -> dict:
    from amp_bench.analysis.advice.evidence import CASE_COLUMNS
    from amp_bench.analysis.explain.categories import CATEGORIES
    keep = [*CASE_COLUMNS, "precision", "device", "device_name", "step_time_ms_median", "explain_status",
            "explain_trace", "explain_profiled_ms", "explain_host_ms", *(f"explain_{c}_ms" for c in CATEGORIES)]
    record = {k: (None if pd.isna(row.get(k)) else row.get(k)) for k in keep if k in row}
    record["explain_trace"] = f"traces/{stem}.json.gz"
    return record


def probe(run_dir: str, *labels: str) -> None:
    """tests/data/advice/probe/ from a CPU run with explain on: the named models' first repeat and its files."""
    run, out = Path(run_dir), DATA / "probe"
    out.mkdir(parents=True, exist_ok=True)
    rows = pd.read_csv(run / "results.csv")
    for row in rows[(rows["repeat"] == 0) & rows["model_label"].isin(labels)].to_dict("records"):
        trace = run / row["explain_trace"]
        stem = trace.name.removesuffix(".json.gz")
        for suffix in (".layers.json", ".probe.json"):
            shutil.copy(trace.with_name(stem + suffix), out / f"{stem}{suffix}")
        with gzip.GzipFile(out / f"{stem}.onednn.txt.gz", "wb", compresslevel=9, mtime=0) as fh:
            fh.write(trace.with_name(f"{stem}.onednn.txt").read_bytes())
        (out / f"{stem}.row.json").write_text(json.dumps(_row(row, stem), indent=1, default=str) + "\n")
        print(f"{out / stem}")


if __name__ == "__main__":
    {"probe": probe}[sys.argv[1]](*sys.argv[2:])
