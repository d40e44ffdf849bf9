"""Builds the real readings tests/data/advice/ holds for the advice rules' tests (its README says where each is from).

    python benchmarks/advice_fixtures.py casts RUN_DIR           # a CPU run of benchmarks/advice_casts.yaml
    python benchmarks/advice_fixtures.py probe RUN_DIR LABEL...  # cases of a run with the shape probe's readings

casts: each case of the run becomes STEM.row.json (the row's columns advice reads), STEM.layers.json (as the
worker saved it) and STEM.json.gz: its trace trimmed to the first two profiled steps' CPU ops and annotations,
with the shapes and types advice reads. probe: the named models' first repeat as STEM.row.json, with the files
its worker saved beside the trace as they are (the layers, the shape probe's readings, oneDNN's verbose step
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
CATS = ("cpu_op", "user_annotation")
ARGS = ("Input Dims", "Input type", "Concrete Inputs")
STEP = "amp_bench::step"


def trimmed(events: list[dict], steps: int = 2) -> dict:
    """The CPU ops and annotations of the first `steps` profiled steps, with only the args advice reads."""
    regions = sorted((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))) for e in events
                     if e.get("name") == STEP and e.get("ph") == "X")[:steps]
    out = []
    for e in events:
        if e.get("ph") != "X" or e.get("cat") not in CATS:
            continue
        if not any(start - 1 <= float(e["ts"]) <= end + 1 for start, end in regions):
            continue
        args = {k: v for k, v in (e.get("args") or {}).items() if k in ARGS}
        out.append({k: e[k] for k in ("ph", "cat", "name", "pid", "tid", "ts", "dur") if k in e}
                   | ({"args": args} if args else {}))
    return {"traceEvents": out}


def _row(row: dict, stem: str) -> dict:
    from amp_bench.analysis.advice.evidence import CASE_COLUMNS
    from amp_bench.analysis.explain.categories import CATEGORIES
    keep = [*CASE_COLUMNS, "precision", "device", "device_name", "step_time_ms_median", "explain_status",
            "explain_trace", "explain_profiled_ms", "explain_host_ms", *(f"explain_{c}_ms" for c in CATEGORIES)]
    record = {k: (None if pd.isna(row.get(k)) else row.get(k)) for k in keep if k in row}
    record["explain_trace"] = f"traces/{stem}.json.gz"
    return record


def casts(run_dir: str) -> None:
    """tests/data/advice/casts/ from a CPU run of benchmarks/advice_casts.yaml: every case, repeat 0."""
    run, out = Path(run_dir), DATA / "casts"
    out.mkdir(parents=True, exist_ok=True)
    rows = pd.read_csv(run / "results.csv")
    for row in rows[rows["repeat"] == 0].to_dict("records"):
        trace = run / row["explain_trace"]
        stem = trace.name.removesuffix(".json.gz")
        events = json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
        with gzip.GzipFile(out / f"{stem}.json.gz", "wb", compresslevel=9, mtime=0) as fh:
            fh.write(json.dumps(trimmed(events), separators=(",", ":")).encode())
        shutil.copy(trace.with_name(f"{stem}.layers.json"), out / f"{stem}.layers.json")
        (out / f"{stem}.row.json").write_text(json.dumps(_row(row, stem), indent=1, default=str) + "\n")
        print(f"{out / stem}: {(out / f'{stem}.json.gz').stat().st_size // 1024} KiB")


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
    {"casts": casts, "probe": probe}[sys.argv[1]](*sys.argv[2:])
