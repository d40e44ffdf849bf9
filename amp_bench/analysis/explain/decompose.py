"""The speedup decomposed: where a mode's step saved (or added) time against the fp32 step of the same
model, batch and compile mode, against what this hardware allows each category (the ceiling), and
whether each change is beyond its noise; torch-free (pandas).

Why by hand: no profiler compares two profiles; the comparison is the whole point of explaining an
AMP speedup. Inputs are per-category times of the profiled steps of each mode (trace.Profile, or the
`explain_*` columns of results rows, whose `explain_step_samples` keep every step). The measured
speedup is passed in from the timed windows: the profiled steps are never the measured figure. A
profile whose step took more than 1.5x the measured median is marked distorted (the profiler's own
cost changed what it measured). The ceiling is ceiling.py's; the noise rule noise.py's; the sentence
sentence.py's.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

import pandas as pd

from amp_bench import identity, modes
from amp_bench.analysis.explain import ceiling as ceilings
from amp_bench.analysis.explain import noise
from amp_bench.analysis.explain.categories import ACCELERATED, CATEGORIES, HOST, LABELS
from amp_bench.analysis.explain.sentence import sentence
from amp_bench.analysis.intervals import paired_log_interval
from amp_bench.analysis.speedups import clean_pairs, paired_log_ratios
from amp_bench.store.flags import positive, text, true_rows
from amp_bench.store.results import EXPLAIN_COLUMNS  # the results-table columns, in order: one list

DISTORTED_RATIO = 1.5
PHASE_COLUMNS = ("forward", "backward", "optimizer", "scaler")


def _samples_json(profile) -> str:
    """Every profiled step's ms per category (and host, wall) as compact JSON for the results row."""
    return json.dumps({k: [round(v, 4) for v in values] for k, values in profile.samples().items()},
                      separators=(",", ":"))


def profile_columns(profile, measured_ms: float | None, misaligned_share: float | None = None,
                    misaligned_layers: str = "", units: dict | None = None) -> dict:
    """The `explain_*` columns of one results row from its profile (trace.Profile). `units`: the
    Tensor Core (CUDA) or oneDNN ISA (CPU) reading, {'share': ..., 'summary': ...}, when there is one."""
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
        "explain_profiled_steps": len(profile.steps), "explain_step_samples": _samples_json(profile),
        "explain_tensor_core_share": (units or {}).get("share"),
        "explain_kernel_units": (units or {}).get("summary", ""),
    })
    out.update({f"explain_phase_{p}_ms": profile.phases_ms.get(p) for p in PHASE_COLUMNS})
    return {c: out.get(c) for c in EXPLAIN_COLUMNS}


def unavailable_columns(reason: str, trace: str = "") -> dict:
    """A row whose profile failed or was not taken: every figure empty, the reason said, its trace's path kept."""
    return {c: None for c in EXPLAIN_COLUMNS} | dict(
        explain_trace=trace, explain_misaligned_layers="", explain_status="unavailable", explain_reason=reason,
        explain_step_samples="", explain_kernel_units="")


def times_from_row(row) -> dict[str, float]:
    """{category: ms, 'host': ms} from a row carrying the explain_* columns: the medians of its pooled
    profiled steps where the row carries them, else the columns."""
    pooled = row.get("noise") if isinstance(row, dict) else None
    if pooled is not None and pooled.samples:
        import statistics
        return {k: statistics.median(pooled.samples.get(k) or [0.0]) for k in list(CATEGORIES) + [HOST]}
    return {c: float(row.get(f"explain_{c}_ms") or 0.0) for c in list(CATEGORIES) + [HOST]}


@dataclass
class Noise:
    """What the noise rule needs of one side: per-step samples pooled from `processes` processes."""
    samples: dict[str, list[float]]
    processes: int = 1

    def spread(self, keys) -> noise.Spread | None:
        return noise.spread(noise.summed(self.samples, keys), self.processes)


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
    ideal: ceilings.Ideal | None = None
    held_back: list = field(default_factory=list)  # ceiling.held_back
    beat_ideal: list = field(default_factory=list)  # ceiling.beat_ideal
    base_noise: Noise | None = None
    mode_noise: Noise | None = None
    measured_interval: tuple[float, float] | None = None

    @property
    def profiled_speedup(self) -> float | None:
        return self.base_total_ms / self.mode_total_ms if self.mode_total_ms else None

    def changed(self, keys) -> bool | None:
        """Did these categories' summed time change beyond its noise? None without samples."""
        if not self.base_noise or not self.mode_noise:
            return None
        return noise.changed(self.base_noise.spread(keys), self.mode_noise.spread(keys))

    def noise_width(self, keys) -> float:
        """The wider relative half-width of the two sides' spreads of these categories."""
        spreads = [n.spread(keys) for n in (self.base_noise, self.mode_noise) if n]
        return max((s.half_width() for s in spreads if s), default=0.0)

    def speedup_interval(self, keys) -> tuple[float, float] | None:
        """These categories' speedup interval from the two sides' spreads; None without samples."""
        if not self.base_noise or not self.mode_noise:
            return None
        return noise.speedup_interval(self.base_noise.spread(keys), self.mode_noise.spread(keys))

    @property
    def profiled_interval(self) -> tuple[float, float] | None:
        return self.speedup_interval(list(CATEGORIES) + [HOST])

    @property
    def explains_measurement(self) -> bool:
        """False when the profiled and the measured speedups disagree beyond their intervals."""
        measured = self.measured_interval or ((self.measured_speedup,) * 2 if self.measured_speedup else None)
        return not noise.disagree(self.profiled_interval, measured)

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
              measured_speedup: float | None = None, distorted: bool = False, device_type: str = "cuda",
              emulated: bool = False, ideal: ceilings.Ideal | None = None, base_noise: Noise | None = None,
              mode_noise: Noise | None = None, measured_interval: tuple[float, float] | None = None) -> Decomposition:
    """`base`, `mode`: {category: ms per step} (CATEGORIES, plus 'host' when known) of the profiled
    steps (medians); `baseline` names the base's mode (the registry's reference unless given);
    `ideal`: each category's ideal speedup (ceiling.py), without which there is no ceiling."""
    baseline = baseline or modes.reference()
    keys = list(CATEGORIES) + ([HOST] if HOST in base or HOST in mode else [])
    base = {k: base.get(k, 0.0) for k in keys}
    mode = {k: mode.get(k, 0.0) for k in keys}
    base_total, mode_total = sum(base.values()), sum(mode.values())
    saved_total = base_total - mode_total
    table = pd.DataFrame([{"category": k, "base_ms": base[k], "mode_ms": mode[k], "speedup": _ratio(base[k], mode[k]),
                           "saved_ms": base[k] - mode[k],
                           "saved_share": (base[k] - mode[k]) / saved_total if saved_total else None,
                           "base_share": base[k] / base_total if base_total else None} for k in keys])
    acc_base, acc_mode = sum(base[k] for k in ACCELERATED), sum(mode[k] for k in ACCELERATED)
    bound = ceilings.ceiling(base, ideal) if ideal else None
    return Decomposition(mode_name, baseline, table, base_total, mode_total, _ratio(acc_base, acc_mode),
                         acc_base / base_total if base_total else 0.0,
                         (mode["cast"] - base["cast"]) / base_total if base_total else 0.0,
                         bound, measured_speedup, distorted, device_type, emulated=emulated, ideal=ideal,
                         held_back=ceilings.held_back(base, mode, ideal) if ideal else [],
                         beat_ideal=ceilings.beat_ideal(base, mode, ideal) if ideal else [],
                         base_noise=base_noise, mode_noise=mode_noise, measured_interval=measured_interval)


def _pooled(rows: pd.DataFrame) -> Noise | None:
    """Every profiled step of these rows (one per repeat), pooled: the noise rule's samples."""
    pooled: dict[str, list[float]] = {}
    processes = 0
    for cell in rows.get("explain_step_samples", pd.Series(dtype=object)):
        if not isinstance(cell, str) or not cell.startswith("{"):
            continue
        processes += 1
        for key, values in json.loads(cell).items():
            pooled.setdefault(key, []).extend(values)
    return Noise(pooled, processes) if processes else None


def _measured_spread(rows: pd.DataFrame) -> noise.Spread | None:
    """The measured step time's spread over the repeats: their medians and confidence intervals."""
    values = [v for c in ("step_time_ms_median", "step_time_ms_ci_low", "step_time_ms_ci_high") if c in rows
              for v in rows[c].dropna()]
    return noise.spread(values, processes=len(rows)) if values else None


def ideal_for(precision: str, row: dict, base: dict) -> ceilings.Ideal:
    """Each category's ideal speedup for a mode, from what the rows say of the hardware."""
    if row["device_type"].startswith("cuda"):
        accelerated, source = ceilings.gpu_units(positive(row.get("peak_tflops")), positive(base.get("peak_tflops")),
                                                 positive(row.get("peak_tflops_bf16")), precision)
    elif not text(row.get("cpu_bf16_isa")):
        accelerated, source = None, "these results do not say the CPU's ISA (cpu_bf16_isa): no ceiling"
    else:
        ratio, source = ceilings.cpu_unit(precision, row.get("cpu_bf16_isa", ""))
        accelerated = {k: ratio for k in ACCELERATED}
    return ceilings.ideal_factors(precision, accelerated, source)


def _cases(results: pd.DataFrame):
    """(case label, {precision: median row}) per model, batch, layout, machine and compile mode, over
    the rows whose breakdown is there (status ok or distorted: a case's first repeat profiles); the
    measured figures come from every ok repeat (measured_speedups)."""
    if results.empty or "explain_status" not in results:
        return
    ok = results[results["explain_status"].isin(["ok", "distorted"]) & (results.get("status", "ok") == "ok")]
    keys = [k for k in identity.group_keys() if k in ok]
    machines = ok["device_name"].nunique() if "device_name" in ok else 1
    numeric = [c for c in EXPLAIN_COLUMNS + ["step_time_ms_median", "peak_tflops", "peak_tflops_bf16"]
               if c in ok and pd.api.types.is_numeric_dtype(ok[c])]
    for _, case in ok.groupby(keys, dropna=False, sort=False) if keys else [((), ok)]:
        first = case.iloc[0]
        label = identity.case_label(first) if "batch_size" in case else str(first.get("model_label", "case"))
        if machines > 1:  # results merged from several machines: never one bar for two of them
            label += f" on {first['device_name']}"
        by_mode = {}
        for precision, rows in case.groupby("precision", sort=False):
            # a repeat whose profiled steps the profiler (or a noisy neighbour) slowed is left out
            # while another repeat's are clean; distorted only when every repeat's are
            clean = rows[rows["explain_status"] == "ok"]
            used = clean if not clean.empty else rows
            row = used[numeric].median().to_dict()
            if "step_time_ms_median" in rows:  # the measured figure is every repeat's, as the run's own
                row["step_time_ms_median"] = rows["step_time_ms_median"].median()
                row["measured_spread"] = _measured_spread(rows)
            row["explain_status"] = "ok" if not clean.empty else "distorted"
            row["case_id"] = str(rows.iloc[0].get("case_id", ""))
            row["device_type"] = str(rows.iloc[0].get("device", "cpu"))
            row["emulated"] = bool(true_rows(rows["emulated"]).any()) if "emulated" in rows else False
            row["cpu_bf16_isa"] = text(rows.iloc[0].get("cpu_bf16_isa"))
            row["noise"] = _pooled(used)
            row["contended"] = (int(true_rows(rows["contended"]).sum()) if "contended" in rows else 0, len(rows))
            by_mode[precision] = row
        yield label, by_mode


def explain_results(results: pd.DataFrame, baseline: str | None = None) -> list[tuple[str, Decomposition]]:
    """Every mode against the baseline of its case, from results rows with explain_* columns;
    the measured speedup is the ratio of the timed windows' median step times. The baseline is the
    mode registry's reference unless one is named."""
    baseline = baseline or modes.reference()
    paired = measured_speedups(results, baseline)
    out = []
    for label, by_mode in _cases(results):
        base = by_mode.get(baseline)
        if base is None:
            continue
        for precision, row in by_mode.items():
            if precision == baseline:
                continue
            measured = _ratio(base.get("step_time_ms_median") or 0.0, row.get("step_time_ms_median") or 0.0)
            interval = noise.speedup_interval(base.get("measured_spread"), row.get("measured_spread"))
            if row.get("case_id") in paired:  # the run's own figure: paired per repeat, as every table prints it
                measured, interval = paired[row["case_id"]]
            distorted = "distorted" in (row["explain_status"], base["explain_status"])
            device = "cuda" if row["device_type"].startswith("cuda") else "cpu"
            d = decompose(times_from_row(base), times_from_row(row), precision, baseline, measured, distorted, device,
                          emulated=row["emulated"], ideal=ideal_for(precision, row, base), base_noise=base["noise"],
                          mode_noise=row["noise"], measured_interval=interval)
            contended = [c for c in (base.get("contended"), row.get("contended")) if c]
            if sum(c[0] for c in contended):
                d.notes.append(f"{sum(c[0] for c in contended)} of {sum(c[1] for c in contended)} repeats were "
                               "measured on a contended machine")
            out.append((label, d))
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


def measured_speedups(results: pd.DataFrame, baseline: str) -> dict:
    """case id -> (the paired speedup over `baseline`, its 95% interval), from every ok repeat of the run
    (analysis/speedups: the ratio within each repeat, t on their logs), so a sentence says the figure
    the run's table says; cases with fewer than two pairs are left to the breakdown's own figure."""
    ok = results[results.get("status", pd.Series("ok", index=results.index)) == "ok"]
    if ok.empty or not {"step_time_ms_median", "repeat", "run_id", "group_id", "case_id"} <= set(ok.columns):
        return {}  # rows without the identity every run writes (hand-made): the breakdown's own figure
    out = {}
    for _, pairs in paired_log_ratios(ok, baseline).groupby(identity.case_keys(), dropna=False):
        pairs = clean_pairs(pairs)
        found = paired_log_interval(pairs["_log"])
        if found:  # one pair: the breakdown's own reading of the windows' spread says it better
            out[pairs["case_id"].iloc[0]] = (found[0], (found[1], found[2]))
    return out
