"""Headroom results, torch-free: each precision's largest batch and throughput
as multiples of fp32's, which rows failed, and the loader the report uses. The search itself runs
in amp_bench.studies.headroom_search."""
from __future__ import annotations

import pandas as pd

from amp_bench import identity
from amp_bench.store.flags import is_true, text

FITS = ("ok", "nonfinite")  # memory held; a non-finite loss in a 2-step probe is not a memory verdict


def ratios_vs_fp32(table: pd.DataFrame) -> pd.DataFrame:
    """Each precision's largest batch and its throughput there, as multiples of fp32's."""
    keys = ["run_id"] + [a for a in identity.case_axes() if a != "batch_size"]  # the batch is what was searched
    filled = table.reindex(columns=keys).astype(str)
    fp32 = table[(table["precision"] == "fp32") & (table["status"] == "ok")]
    base = {tuple(filled.loc[i]): r for i, r in fp32.iterrows()}
    batch_ratio, lower_bound, speed_ratio = [], [], []
    for i, r in table.iterrows():
        b = base.get(tuple(filled.loc[i]))
        ok = b is not None and r["status"] == "ok" and bool(b["max_batch_size"])
        # fp32 at the search limit: its true maximum is unknown, and so is the ratio
        ok = ok and not is_true(b.get("limit_reached"))
        batch_ratio.append(r["max_batch_size"] / b["max_batch_size"] if ok else float("nan"))
        lower_bound.append(ok and is_true(r.get("limit_reached")))  # the mode itself hit the limit: at least this
        t = b["throughput_at_max"] if b is not None else float("nan")
        speed_ratio.append(r["throughput_at_max"] / t if b is not None and r["status"] == "ok" and t == t and t
                           else float("nan"))
    return table.assign(batch_ratio_vs_fp32=batch_ratio, batch_ratio_is_lower_bound=lower_bound,
                        throughput_ratio_vs_fp32=speed_ratio)


def failed_rows(table: pd.DataFrame, allow_unsupported: bool = True) -> list[str]:
    """'model precision: status (reason)' for every search that found no answer (a probe that failed
    otherwise, nothing fits) or whose measurement at the largest batch failed: the CLI exits 1 on
    any. `unsupported` is a finding, not a failure, unless the caller needs every row (the GPU check)."""
    allowed = {"ok", "unsupported"} if allow_unsupported else {"ok"}
    out = []
    for _, row in table.iterrows():
        label = f"{identity.case_label(row, without=('batch_size',))} {row.get('precision')}"
        reason = text(row.get("reason")).strip()
        reason = reason.splitlines()[0][:200] if reason else ""
        measured = text(row.get("measure_status"))
        if row.get("status") not in allowed:
            out.append(f"{label}: {row.get('status')}" + (f" ({reason})" if reason else ""))
        elif measured not in ("", "ok"):
            batch = row.get("max_batch_size")
            batch = f"{batch:.0f}" if isinstance(batch, (int, float)) else batch
            out.append(f"{label}: the measurement at its largest batch ({batch}) ended {measured}")
    return out


def load_headroom(run_dirs) -> dict[str, pd.DataFrame]:
    from amp_bench.store.results import read_table
    return {name: read_table(run_dirs, name) for name in ("headroom", "headroom_probes")}
