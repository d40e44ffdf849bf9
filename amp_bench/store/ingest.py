"""`amp_bench ingest FILE.json`: a pytest-benchmark JSON file -> an amp_bench run directory.

Each benchmark becomes a result row (times converted from seconds to milliseconds); its raw
per-round times, when the file has them (`--benchmark-save-data`), become per-step samples; the
amp_bench fixture's extra_info (case, precision, batch size, memory) fills the rest.
"""
from __future__ import annotations

import json
from pathlib import Path

from amp_bench.errors import UserError
from amp_bench.stats import MEASURED_PHASE, Window, samples_per_second
from amp_bench.store.fingerprint import fingerprint_columns
from amp_bench.store.results import RunStore, make_run_id


def ingest(path: str | Path, results_dir: str | Path = "results") -> Path:
    path = Path(path)
    data = _read(path)
    machine = data.get("machine_info") or {}
    amp = machine.get("amp_bench") or {}
    device, versions = amp.get("device") or {}, amp.get("versions") or {}
    store = RunStore(Path(results_dir), make_run_id(f"{device.get('type', 'unknown')}-pytest-benchmark",
                                                    host=machine.get("node")))
    # a benchmark run like any other: the same kind, and the fingerprint that keys its series
    fingerprint = fingerprint_columns(device, versions, amp.get("gpu") or {}, machine.get("node") or "",
                                      (machine.get("cpu") or {}).get("count"))
    store.write_manifest(run_id=store.run_id, kind="benchmark", ingested_from="pytest-benchmark", status="complete",
                         source=str(path.resolve()), device=device, versions=versions,
                         pytest_benchmark={"version": data.get("version"), "datetime": data.get("datetime"),
                                           "commit_info": data.get("commit_info")}, machine_info=machine)
    machine_columns = {**fingerprint, "hostname": machine.get("node"), "torch_version": versions.get("torch_version")}
    for i, bench in enumerate(data["benchmarks"]):
        if "median" not in (bench.get("stats") or {}):
            raise UserError(f"{path}: benchmarks[{i}].stats.median: missing")
        row, samples = _row(bench, i, store.run_id, data, amp, machine_columns)
        store.add(row, samples)
    return store.dir


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: not a pytest-benchmark JSON file ({exc})") from None
    benchmarks = data.get("benchmarks") if isinstance(data, dict) else None
    if not isinstance(benchmarks, list) or not benchmarks:
        raise UserError(f"{path}: benchmarks: expected a non-empty list (is this a pytest-benchmark JSON file?)")
    return data


def _row(bench: dict, i: int, run_id: str, data: dict, amp: dict, machine_columns: dict) -> tuple[dict, list]:
    """One benchmark as a results row (pytest-benchmark's seconds as ms) and its rounds as samples."""
    stats, extra = bench.get("stats") or {}, bench.get("extra_info") or {}
    device = amp.get("device") or {}
    case_id = extra.get("case_id") or bench.get("fullname") or bench.get("name") or f"benchmark-{i}"
    batch = extra.get("batch_size")
    row = {
        "run_id": run_id, "suite": extra.get("suite", "pytest-benchmark"), "case_id": case_id,
        "model_label": extra.get("case_id", bench.get("name")), "batch_size": batch,
        "precision": extra.get("precision"), "device": extra.get("device", device.get("type")),
        "device_name": extra.get("device_name", device.get("name")), "architecture": amp.get("architecture"),
        "repeat": 0, "status": "ok", "reason": "", "steps": stats.get("rounds"),
        **{f"step_time_ms_{k}": stats.get(k, float("nan")) * 1e3 for k in ("median", "mean", "min", "max", "iqr")},
        "step_time_cv": stats["stddev"] / stats["mean"] if stats.get("mean") else None, "throughput": None,
        "peak_mem_allocated_bytes": extra.get("peak_mem_allocated_bytes"),
        "peak_mem_reserved_bytes": extra.get("peak_mem_reserved_bytes"),
        "scaler_skipped_steps": extra.get("scaler_skipped_steps"), "output_dtype": extra.get("output_dtype"),
        "timestamp": data.get("datetime"), "pytest_benchmark_name": bench.get("fullname", bench.get("name")),
        **machine_columns,
    }
    rounds_s = stats.get("data") or [ms / 1e3 for ms in extra.get("step_times_ms") or []]
    samples = [{"run_id": run_id, "case_id": case_id, "precision": row["precision"], "repeat": 0,
                "phase": MEASURED_PHASE, "step": j, "step_time_ms": t * 1e3, "loss": None}
               for j, t in enumerate(rounds_s)]
    if batch and rounds_s:  # the rounds back to back: pytest-benchmark measures no gap between them
        row["throughput"] = Window.from_steps([t * 1e3 for t in rounds_s], batch).throughput
    elif batch and stats.get("mean"):  # no raw rounds: mean round time x rounds is the window
        row["throughput"] = samples_per_second(batch, stats["mean"])
    return row, samples
