"""The speedup decomposed: where a mode's step saved (or added) time against the fp32 step of the same
model, batch and compile mode, and what the step could reach if only the accelerated work got
faster; torch-free (pandas).

Why by hand: no profiler compares two profiles; the comparison is the whole point of explaining an
AMP speedup. Inputs are per-category times of one profiled step per mode (trace.Profile, or the
`explain_*` columns of results rows). The measured speedup is passed in from the timed windows: the
profiled step is never the measured figure. A profile whose step took more than 1.5x the measured
median is marked distorted (the profiler's own cost changed what it measured).

Amdahl ceiling: total_fp32 / (total_fp32 - A + A / f), A = the fp32 step's GEMM + conv + attention
time, f = the speedup those categories got in the mode's profile; every other category unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from amp_bench import modes
from amp_bench.analysis.explain.categories import ACCELERATED, CATEGORIES, HOST, LABELS, MEMORY_BOUND
from amp_bench.store.flags import true_rows
from amp_bench.store.results import EXPLAIN_COLUMNS  # the results-table columns, in order: one list

DISTORTED_RATIO = 1.5
PHASE_COLUMNS = ("forward", "backward", "optimizer", "scaler")


def profile_columns(profile, measured_ms: float | None, misaligned_share: float | None = None,
                    misaligned_layers: str = "") -> dict:
    """The `explain_*` columns of one results row from its profile (trace.Profile)."""
    out = {f"explain_{c}_ms": profile.categories_ms.get(c, 0.0) for c in CATEGORIES}
    ratio = profile.wall_ms / measured_ms if measured_ms else None
    status, reason = "ok", ""
    if ratio is not None and ratio > DISTORTED_RATIO:
        status, reason = "distorted", (f"the profiled step took {ratio:.1f}x the measured median: the profiler's "
                                       "own cost shapes this breakdown")
    out.update({
        "explain_host_ms": profile.host_ms, "explain_busy_ms": profile.busy_ms, "explain_profiled_ms": profile.wall_ms,
        "explain_profiled_vs_measured": ratio, "explain_cast_share": profile.share("cast"),
        "explain_other_share": profile.share("other"), "explain_misaligned_flop_share": misaligned_share,
        "explain_misaligned_layers": misaligned_layers, "explain_trace": profile.trace_path or "",
        "explain_status": status, "explain_reason": "; ".join([reason] + list(profile.notes)).strip("; "),
    })
    out.update({f"explain_phase_{p}_ms": profile.phases_ms.get(p) for p in PHASE_COLUMNS})
    return {c: out.get(c) for c in EXPLAIN_COLUMNS}


def unavailable_columns(reason: str) -> dict:
    """A row whose profile failed or was not taken: every figure empty, the reason said."""
    out = {c: None for c in EXPLAIN_COLUMNS}
    out.update(explain_trace="", explain_misaligned_layers="", explain_status="unavailable", explain_reason=reason)
    return out


def times_from_row(row) -> dict[str, float]:
    """{category: ms, 'host': ms} from a row carrying the explain_* columns."""
    out = {c: float(row.get(f"explain_{c}_ms") or 0.0) for c in CATEGORIES}
    out[HOST] = float(row.get("explain_host_ms") or 0.0)
    return out


@dataclass
class Decomposition:
    mode: str
    baseline: str
    table: pd.DataFrame  # category, base_ms, mode_ms, speedup, saved_ms, saved_share, base_share
    base_total_ms: float
    mode_total_ms: float
    accelerated_speedup: float | None
    accelerated_share: float
    cast_added_share: float
    ceiling: float | None
    measured_speedup: float | None
    distorted: bool = False
    device_type: str = "cuda"
    notes: list[str] = field(default_factory=list)
    emulated: bool = False  # the mode ran on hardware that only emulates it: the sentence says so

    @property
    def profiled_speedup(self) -> float | None:
        return self.base_total_ms / self.mode_total_ms if self.mode_total_ms else None

    def waterfall(self) -> list[tuple[str, float]]:
        """(label, ms) steps from the fp32 step to the mode's: the start, one signed change per
        category that moved (negative = time saved), the end."""
        steps = [(f"{self.baseline} step", self.base_total_ms)]
        for _, r in self.table.iterrows():
            delta = r["mode_ms"] - r["base_ms"]
            if abs(delta) >= 1e-3 * max(self.base_total_ms, 1e-9):
                steps.append((LABELS.get(r["category"], r["category"]), delta))
        steps.append((f"{self.mode} step", self.mode_total_ms))
        return steps


def _ratio(a: float, b: float) -> float | None:
    return a / b if b > 0 and a > 0 else None


def decompose(base: dict[str, float], mode: dict[str, float], mode_name: str, baseline: str | None = None,
              measured_speedup: float | None = None, distorted: bool = False,
              device_type: str = "cuda", emulated: bool = False) -> Decomposition:
    """`base`, `mode`: {category: ms per step} (CATEGORIES, plus 'host' when known) of one profiled
    step each; `baseline` names the base's mode (the registry's reference unless given)."""
    baseline = baseline or modes.reference()
    keys = list(CATEGORIES) + ([HOST] if HOST in base or HOST in mode else [])
    base_total = sum(base.get(k, 0.0) for k in keys)
    mode_total = sum(mode.get(k, 0.0) for k in keys)
    saved_total = base_total - mode_total
    rows = []
    for k in keys:
        b, m = base.get(k, 0.0), mode.get(k, 0.0)
        rows.append({"category": k, "base_ms": b, "mode_ms": m, "speedup": _ratio(b, m), "saved_ms": b - m,
                     "saved_share": (b - m) / saved_total if saved_total else None,
                     "base_share": b / base_total if base_total else None})
    table = pd.DataFrame(rows)
    acc_base = sum(base.get(k, 0.0) for k in ACCELERATED)
    acc_mode = sum(mode.get(k, 0.0) for k in ACCELERATED)
    factor = _ratio(acc_base, acc_mode)
    ceiling = None
    if factor and base_total:
        ceiling = base_total / (base_total - acc_base + acc_base / factor)
    return Decomposition(mode_name, baseline, table, base_total, mode_total, factor,
                         acc_base / base_total if base_total else 0.0,
                         (mode.get("cast", 0.0) - base.get("cast", 0.0)) / base_total if base_total else 0.0,
                         ceiling, measured_speedup, distorted, device_type, emulated=emulated)


def _join(labels: list[str]) -> str:
    return labels[0] if len(labels) == 1 else ", ".join(labels[:-1]) + " and " + labels[-1]


def _faster(factor: float) -> str:
    """'2.6x faster', for a slowdown '7.7x slower' (never '0.1x faster'), and within 5% 'no faster'."""
    if abs(factor - 1) < 0.05:
        return "no faster"
    return f"{factor:.1f}x faster" if factor >= 1 else f"{1 / factor:.1f}x slower"


def _speed(factor: float) -> str:
    """A whole step's speedup: '1.6x', or for a slowdown '22.1x slower' (never '0.0x')."""
    return f"{factor:.1f}x" if factor >= 0.95 else f"{1 / factor:.1f}x slower"


def sentence(d: Decomposition) -> str:
    """One sentence in the run's headline style, e.g. 'amp_bf16 made GEMM+conv 2.6x faster, but they
    are 58% of the fp32 step; elementwise and norms (31%) gained 1.3x; casts added 4%: 1.6x measured,
    1.9x the ceiling with the rest unchanged'."""
    t = d.table.set_index("category")
    share = t["base_share"].fillna(0.0)
    mode = modes.with_emulated(d.mode, d.emulated)  # an emulated mode's breakdown explains the emulation
    present = [k for k in ACCELERATED if share.get(k, 0.0) >= 0.01] or [k for k in ACCELERATED if t.loc[k, "base_ms"] > 0]
    parts = []
    if present and d.accelerated_speedup:
        they = "they are" if len(present) > 1 else "it is"
        # 'but' when they sped up (the rest limits the gain); 'and' when they slowed (they drive it)
        link = "but" if d.accelerated_speedup >= 1.05 else "and"
        parts.append(f"{mode} made {'+'.join(LABELS[k] for k in present)} {_faster(d.accelerated_speedup)}, "
                     f"{link} {they} {d.accelerated_share:.0%} of the {d.baseline} step")
    else:
        parts.append(f"{mode}: no GEMM, convolution or attention time in the {d.baseline} profile")
    memory = sorted((k for k in MEMORY_BOUND if share.get(k, 0.0) >= 0.05), key=lambda k: -share[k])[:3]
    if memory:
        b, m = t.loc[memory, "base_ms"].sum(), t.loc[memory, "mode_ms"].sum()
        gain = _ratio(b, m)
        parts.append(f"{_join([LABELS[k] for k in memory])} ({share[memory].sum():.0%}) "
                     + (("did not change" if abs(gain - 1) < 0.05 else f"gained {gain:.1f}x" if gain >= 1
                         else f"ran {1 / gain:.1f}x slower") if gain else "did not change"))
    cast = f"casts added {d.cast_added_share:.0%}" if d.cast_added_share >= 0.005 else \
        f"casts took {share.get('cast', 0.0):.0%}"
    head = "; ".join(parts + [cast])
    speed = f"{_speed(d.measured_speedup)} measured" if d.measured_speedup else \
        f"{_speed(d.profiled_speedup)} in the profiled steps" if d.profiled_speedup else "no speedup figure"
    # Amdahl: a ceiling when those categories sped up; when they slowed, the same formula is the step
    # they alone would give
    what = "the ceiling" if d.ceiling and d.ceiling >= 1 else "from them alone"
    ceiling = f", {_speed(d.ceiling)} {what} with the rest unchanged" if d.ceiling else ""
    if d.ceiling and d.measured_speedup and d.measured_speedup > d.ceiling * 1.05:
        if d.profiled_speedup and d.profiled_speedup > d.ceiling * 1.05:
            ceiling += " (beaten: the rest got faster too)"
        else:  # the profile says the step sped up less than the windows did: one of them is off
            ceiling += (f" (the profiled steps show {d.profiled_speedup or 0:.1f}x: the timed windows and the profile "
                        "disagree, a quieter machine settles it)")
    host = t["mode_ms"].get(HOST, 0.0) / d.mode_total_ms if HOST in t.index and d.mode_total_ms else 0.0
    idle = "the device sat idle" if d.device_type == "cuda" else "Python and framework time between ops took"
    tail = f" ({idle} {host:.0%} of the {d.mode} step)" if host >= 0.10 else ""
    if d.distorted:
        tail += " (breakdown distorted: the profiler slowed a step by more than 1.5x)"
    return f"{head}: {speed}{ceiling}{tail}"


CASE_KEYS = ["run_id", "model_label", "batch_size", "image_size", "seq_len", "channels_last", "device_name",
             "compile_mode", "world_size"]


def _cases(results: pd.DataFrame):
    """(case label, {precision: median row}) per model, batch, layout, machine and compile mode, over
    the rows whose breakdown is there (status ok or distorted)."""
    if results.empty or "explain_status" not in results:
        return
    ok = results[results["explain_status"].isin(["ok", "distorted"]) & (results.get("status", "ok") == "ok")]
    keys = [k for k in CASE_KEYS if k in ok]
    machines = ok["device_name"].nunique() if "device_name" in ok else 1
    numeric = [c for c in EXPLAIN_COLUMNS if c in ok and pd.api.types.is_numeric_dtype(ok[c])] + \
        (["step_time_ms_median"] if "step_time_ms_median" in ok else [])
    for key, case in ok.groupby(keys, dropna=False, sort=False) if keys else [((), ok)]:
        first = case.iloc[0]
        label = f"{first.get('model_label', first.get('model', 'model'))} bs {int(first['batch_size'])}" \
            if "batch_size" in case else str(first.get("model_label", "case"))
        if str(first.get("compile_mode", "eager") or "eager") not in ("eager", "nan"):
            label += f" ({first['compile_mode']})"
        if machines > 1:  # results merged from several machines: never one bar for two of them
            label += f" on {first['device_name']}"
        by_mode = {}
        for precision, rows in case.groupby("precision", sort=False):
            # one profiled step per repeat: a repeat whose step the profiler (or a noisy neighbour) slowed
            # is left out while another repeat's is clean; distorted only when every repeat's is
            clean = rows[rows["explain_status"] == "ok"]
            row = (clean if not clean.empty else rows)[numeric].median().to_dict()
            if "step_time_ms_median" in rows:  # the measured figure is every repeat's, as the run's own
                row["step_time_ms_median"] = rows["step_time_ms_median"].median()
            row["explain_status"] = "ok" if not clean.empty else "distorted"
            row["device_type"] = str(rows.iloc[0].get("device", "cpu"))
            row["emulated"] = bool(true_rows(rows["emulated"]).any()) if "emulated" in rows else False
            by_mode[precision] = row
        yield label, by_mode


def explain_results(results: pd.DataFrame, baseline: str | None = None) -> list[tuple[str, Decomposition]]:
    """Every mode against the baseline of its case, from results rows with explain_* columns;
    the measured speedup is the ratio of the timed windows' median step times. The baseline is the
    mode registry's reference unless one is named."""
    baseline = baseline or modes.reference()
    out = []
    for label, by_mode in _cases(results):
        base = by_mode.get(baseline)
        if base is None:
            continue
        for precision, row in by_mode.items():
            if precision == baseline:
                continue
            measured = _ratio(base.get("step_time_ms_median") or 0.0, row.get("step_time_ms_median") or 0.0)
            distorted = "distorted" in (row["explain_status"], base["explain_status"])
            device = "cuda" if row["device_type"].startswith("cuda") else "cpu"
            out.append((label, decompose(times_from_row(base), times_from_row(row), precision, baseline,
                                         measured, distorted, device, emulated=row["emulated"])))
    return out


def category_table(results: pd.DataFrame) -> pd.DataFrame:
    """The per-category table as a CSV holds it: case, precision, category, ms per step, share."""
    rows = []
    for label, by_mode in _cases(results):
        for precision, row in by_mode.items():
            times = times_from_row(row)
            total = sum(times.values())
            rows += [{"case": label, "precision": precision, "category": k, "ms_per_step": v,
                      "share_of_step": v / total if total else None} for k, v in times.items()]
    return pd.DataFrame(rows, columns=["case", "precision", "category", "ms_per_step", "share_of_step"])


def sentences(results: pd.DataFrame, baseline: str | None = None) -> list[str]:
    """'<model> bs <n>: <sentence>' for every mode against its baseline."""
    return [f"{label}: {sentence(d)}" for label, d in explain_results(results, baseline)]
