"""A results row's `explain_*` columns, from what its worker saved after the timed window: the
profiled step's trace (traces/STEM.json.gz) and its GEMM/conv layers (traces/STEM.layers.json).

Called by the parent for every case that asked for a breakdown (studies/benchmark.py), so the
worker only captures (measure/telemetry/profile.py) and everything that judges stays torch-free and
testable on saved files. A failure here never costs the measured row: the columns say "unavailable"
and why, and the trace's path is kept for Perfetto.
"""
from __future__ import annotations

from pathlib import Path

from amp_bench import modes
from amp_bench.analysis.explain import onednn
from amp_bench.analysis.explain.alignment import alignment_table, misaligned_flop_share, misaligned_summary, read_layers
from amp_bench.analysis.explain.decompose import profile_columns, unavailable_columns
from amp_bench.analysis.explain.events import NoGpuActivity
from amp_bench.analysis.explain.kernels import describe
from amp_bench.analysis.explain.trace import read_profile
from amp_bench.stats import layers_path
from amp_bench.store.flags import positive

CAPTURED = "captured"  # the worker's explain_status when it saved a trace for this module to read


def layer_rows(results, run_dirs) -> list[dict]:
    """Every GEMM/conv layer of every profiled step, judged for Tensor Core alignment (multiples of 8;
    16 for fp8): one row per case, repeat and layer, from the layer records saved beside each trace.
    A row whose records are missing or damaged is left out (its results row already says whether its
    breakdown is available)."""
    by_run = {Path(d).name: Path(d) for d in run_dirs}
    out = []
    for _, row in results.iterrows():
        trace, run_dir = row.get("explain_trace"), by_run.get(str(row.get("run_id")))
        if row.get("explain_status") not in ("ok", "distorted") or not isinstance(trace, str) or run_dir is None:
            continue
        device_type = "cuda" if str(row.get("device", "cpu")).startswith("cuda") else "cpu"
        try:
            layers = read_layers(layers_path(run_dir / trace))
        except Exception:  # a lost file drops its layers from the table, nothing else
            continue
        multiple = 16 if modes.get(str(row.get("precision"))).float8_linear else 8
        for layer in alignment_table(layers, int(positive(row.get("flops_per_step")) or 0) or None, device_type):
            out.append({"run_id": row.get("run_id"), "case_id": row.get("case_id"), "repeat": row.get("repeat"),
                        "precision": row.get("precision"), "multiple": multiple,
                        "aligned": layer[f"aligned_{multiple}"], **layer})
    return out


def explain_row(row: dict, run_dir) -> dict:
    """The explain_* columns of one results row (its `explain_trace` is relative to `run_dir`)."""
    status, trace = row.get("explain_status"), row.get("explain_trace") or ""
    if status != CAPTURED:
        why = row.get("explain_reason") or (f"the case ended {row.get('status')} before its profiled step"
                                            if row.get("status") != "ok" else "no profiled step was taken")
        return unavailable_columns(why, trace)
    device_type = "cuda" if str(row.get("device", "cpu")).startswith("cuda") else "cpu"
    try:
        path = Path(run_dir) / trace
        profile = read_profile(path, device_type, trace_path=trace)
        table = alignment_table(read_layers(layers_path(path)), int(positive(row.get("flops_per_step")) or 0) or None,
                                device_type)
        mode = modes.get(str(row.get("precision")))
        multiple = 16 if mode.float8_linear else 8  # fp8 wants 16
        units = describe(profile.tensor_cores, mode.uses_autocast, multiple) if device_type == "cuda" else \
            onednn.describe(onednn.read_records(onednn.records_path(path)))
        return profile_columns(profile, positive(row.get("step_time_ms_median")),
                               misaligned_flop_share(table, multiple), misaligned_summary(table, multiple), units)
    except NoGpuActivity as exc:  # never "ok, idle 100%" for a trace CUPTI recorded nothing in
        return unavailable_columns(str(exc), trace)
    except Exception as exc:  # the breakdown is an explanation, never a reason to lose the row
        return unavailable_columns(f"reading the profile failed: {type(exc).__name__}: {exc}"[:300], trace)
