"""`amp_bench compare BASELINE CANDIDATE`: is the candidate slower, or does it use more memory?

For each case both sides ran, the ratio (candidate / baseline) of:
- step time: the medians of the per-step samples, with a bootstrap confidence interval that
  resamples repeats and the samples within them, widened where Welch's t on the repeats' own medians
  gives a wider one (the repeats are separate processes, which on a VM differ more than the steps
  within one do), and a Mann-Whitney U test;
- throughput: the rows' `throughput` column, the one definition (samples over the measured window's
  wall time, host gaps included: stats.Window), as history and nightly use it: the median across
  each side's repeats (history.run_series' point per run); its interval by the step time's rule
  (Welch's t on the repeats, never narrower than the step time's): it is the step time seen from the
  other side, so the two cannot disagree for lack of data;
- both widened by the machine's own wander within each run (analysis/drift.py): a level change
  smaller than that is not the code's to call;
- the paired speedup over fp32 of every AMP case (drift.speedup_results): what AMP buys, which a
  drifting machine cannot hide; when the step times are unstable and every speedup is decided, the
  speedups decide the exit code, and `decision` says so;
- peak memory: the median across repeats, with the range across repeats as interval.
A regression is called only when the whole interval lies beyond the threshold, so noise alone does
not alert. A case the hardware cannot run (status `unsupported`) on both sides is "not run on either
side" (neutral); one the baseline ran and the candidate cannot is "unsupported in candidate" (a
finding: exit 1); one only the candidate runs is "new in candidate" (neutral).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from amp_bench import stats
from amp_bench.analysis import intervals
from amp_bench.analysis.compare_outputs import to_json, to_junit, to_markdown, write_outputs  # noqa: F401 (re-exported)
from amp_bench.analysis.drift import speedup_results, wander, widen_for_wander
from amp_bench.analysis.gate.history import history_noise
from amp_bench.analysis.intervals import Threshold
from amp_bench.analysis.speedups import MIN_CLEAN_PAIRS, headline_memory
from amp_bench.errors import UserError
from amp_bench.store.fingerprint import fingerprint_mismatch, fingerprints
from amp_bench.store.results import contended, contention_reason

EXIT_OK, EXIT_REGRESSION, EXIT_USAGE, EXIT_NO_DATA, EXIT_UNSTABLE = 0, 1, 2, 3, 4
MIN_SAMPLES = 5  # per side, for a time comparison


@dataclass
class MetricResult:
    case_id: str
    metric: str  # step_time | throughput | peak_memory | speedup (over fp32, paired per repeat)
    baseline: float | None
    candidate: float | None
    ratio: float | None
    ci_low: float | None
    ci_high: float | None
    p_value: float | None
    verdict: str  # regression | improvement | no change | unstable | not enough data | not comparable (contended)
    #               | not run on either side | unsupported in candidate | new in candidate (these: metric "status")
    detail: str = ""


NO_FIGURES = (None,) * 6  # baseline, candidate, ratio, ci_low, ci_high, p_value: a verdict without figures
CONTENDED = "not comparable (contended)"  # every repeat of a case on one side ran on a busy machine
# status `unsupported` (the hardware cannot run the mode): a case-level verdict, metric "status"
NOT_RUN = "not run on either side"  # neutral: no verdict was expected
LOST = "unsupported in candidate"  # the baseline ran it, the candidate's machine cannot: a finding (exit 1)
NEW = "new in candidate"  # neutral, listed
FINDINGS = ("regression", LOST)  # exit 1
NEUTRAL = (NOT_RUN, NEW)  # no change to the exit code, but not a pass on their own


@dataclass
class Comparison:
    baseline: list[str]
    candidate: list[str]
    thresholds: dict[str, str]
    results: list[MetricResult] = field(default_factory=list)
    unmatched: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        verdicts = {r.verdict for r in self.results}
        if verdicts & set(FINDINGS):
            return EXIT_REGRESSION
        # never a pass for lack of data (nor when every case was not run on either side)
        if "not enough data" in verdicts or CONTENDED in verdicts or not verdicts - set(NEUTRAL):
            return EXIT_NO_DATA
        return EXIT_UNSTABLE if "unstable" in verdicts and not self.speedups_decide else EXIT_OK

    @property
    def speedups_decide(self) -> bool:
        """Unstable absolute figures, but every paired speedup compared and decided: they decide."""
        speedups = [r for r in self.results if r.metric == "speedup"]
        unstable = [r for r in self.results if r.verdict == "unstable"]
        return bool(speedups) and bool(unstable) and all(r.metric != "speedup" for r in unstable) and \
            all(self.judged(r) for r in speedups)

    @property
    def decision(self) -> str:
        """Which figures decided the exit code, in one line."""
        code = self.exit_code
        speedups = [r for r in self.results if r.metric == "speedup"]
        if code == EXIT_REGRESSION:
            return f"decided by: {', '.join(sorted({r.metric for r in self.results if self.finding(r)}))} (a finding)"
        if code == EXIT_NO_DATA:
            return "decided by: missing or contended data (no verdict)"
        if self.speedups_decide:
            return (f"decided by: the paired speedups ({len(speedups)} compared, none changed beyond its threshold); "
                    "the step times are too unstable on this machine to compare across runs")
        if code == EXIT_UNSTABLE:
            return "decided by: unstable intervals (neither the step times nor the paired speedups could decide)"
        return "decided by: the step times, throughputs and memory" + (" and the paired speedups" if speedups else "")

    @staticmethod
    def finding(r: MetricResult) -> bool:
        """A regression or a lost mode: exit 1, a JUnit failure."""
        return r.verdict in FINDINGS

    @staticmethod
    def judged(r: MetricResult) -> bool:
        """Compared and passed (no change, improvement); the rest are no verdict or neutral (JUnit skipped)."""
        return r.verdict in ("no change", "improvement")

    @property
    def summary(self) -> str:
        verdicts = {r.verdict for r in self.results}
        if self.exit_code == EXIT_NO_DATA and CONTENDED in verdicts and "not enough data" not in verdicts:
            return CONTENDED
        if self.exit_code == EXIT_REGRESSION:
            return "; ".join(v for v in FINDINGS if v in verdicts)
        return {EXIT_OK: "no regression", EXIT_REGRESSION: "regression", EXIT_NO_DATA: "not enough data",
                EXIT_UNSTABLE: "too unstable to decide"}[self.exit_code]


# ----------------------------------------------------------------------------- loading and matching

def _load_side(inputs: list[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    from amp_bench.store.results import RESULT_COLUMNS, SAMPLE_COLUMNS, find_run_dirs, read_table
    run_dirs = find_run_dirs(inputs)
    results = read_table(run_dirs, "results", RESULT_COLUMNS)
    if results.empty:
        raise UserError(f"{', '.join(map(str, inputs))}: the results tables are empty (no finished case yet)")
    return results, read_table(run_dirs, "samples", SAMPLE_COLUMNS)


def compare(baseline: list[str], candidate: list[str], *, threshold_time: Threshold = Threshold(0.03),
            threshold_throughput: Threshold | None = None, threshold_memory: Threshold = Threshold(0.02),
            threshold_speedup: Threshold = Threshold(0.05), force: bool = False, seed: int = 0,
            noise_floor: dict[str, float] | None = None, history: str | Path | None = None) -> Comparison:
    """noise_floor: case id -> night-to-night noise of its series (log units), or history: a results
    tree to take it from (the candidate's machine): widens each interval by that run-to-run
    variance, and lets fewer than intervals.MIN_REPEATS repeats decide."""
    threshold_throughput = threshold_throughput or threshold_time
    base_rows, base_samples = _load_side(baseline)
    cand_rows, cand_samples = _load_side(candidate)
    comparison = Comparison([str(b) for b in baseline], [str(c) for c in candidate],
                            {"step_time": str(threshold_time), "throughput": str(threshold_throughput),
                             "peak_memory": str(threshold_memory), "speedup": str(threshold_speedup)})
    _check_machines(comparison, base_rows, cand_rows, force)
    if history is not None:
        noise_floor = {**history_noise(history, fingerprints(cand_rows)), **(noise_floor or {})}
        comparison.notes.append(f"night-to-night noise of {len(noise_floor)} series from {history} added to the "
                                "intervals")
    base_ok, cand_ok = base_rows[base_rows["status"] == "ok"], cand_rows[cand_rows["status"] == "ok"]
    base_busy, cand_busy = contended(base_ok), contended(cand_ok)
    wanders = (wander(base_ok[~base_busy]), wander(cand_ok[~cand_busy]))
    context = _CaseContext(base_samples, cand_samples, np.random.default_rng(seed), threshold_time,
                           threshold_throughput, threshold_memory, noise_floor or {}, wanders)
    excluded: dict[str, tuple[int, int]] = {}
    for case_id in dict.fromkeys(list(base_rows["case_id"]) + list(cand_rows["case_id"])):
        comparison.results.extend(_judge_case(case_id, base_rows, cand_rows, base_busy, cand_busy, context,
                                              comparison, excluded))
    comparison.results.extend(speedup_results(base_ok[~base_busy], cand_ok[~cand_busy], threshold_speedup.relative,
                                              MetricResult))
    _add_notes(comparison, excluded, wanders)
    return comparison


@dataclass
class _CaseContext:
    """What every case's comparison shares: the samples, the random stream, thresholds, noise floors
    and each side's machine wander (drift.wander)."""
    base_samples: pd.DataFrame
    cand_samples: pd.DataFrame
    rng: np.random.Generator
    time: Threshold
    throughput: Threshold
    memory: Threshold
    floors: dict
    wanders: tuple


def _check_machines(comparison: Comparison, base_rows: pd.DataFrame, cand_rows: pd.DataFrame, force: bool) -> None:
    differ, message = fingerprint_mismatch(base_rows, cand_rows)
    if differ and not force:
        raise UserError(message + "; pass --force to compare anyway")
    if message:
        comparison.notes.append(message + (" (compared anyway: --force)" if differ else ""))
    starts = [set(rows["worker_start"].dropna().astype(str)) if "worker_start" in rows else set()
              for rows in (base_rows, cand_rows)]
    if all(starts) and starts[0] != starts[1]:
        comparison.notes.append(f"workers started differently (baseline {'/'.join(sorted(starts[0]))}, candidate "
                                f"{'/'.join(sorted(starts[1]))}): a CPU worker's peak RSS includes what it imported")


def _judge_case(case_id, base_rows, cand_rows, base_busy, cand_busy, context: _CaseContext, comparison,
                excluded) -> list[MetricResult]:
    """One case's results: a status verdict, "not comparable (contended)", "not enough data", or its metrics."""
    b_all, c_all = base_rows[base_rows["case_id"] == case_id], cand_rows[cand_rows["case_id"] == case_id]
    status = _status_verdict(case_id, b_all, c_all)
    if status is not None:
        return [status]
    b, c = b_all[b_all["status"] == "ok"], c_all[c_all["status"] == "ok"]
    b_busy, c_busy = base_busy[b.index], cand_busy[c.index]
    # a side left with too few clean repeats by contention (flagged at the window's edges, or stopped early
    # as `contended`) has no verdict (exit 3), as a headline has no figure; otherwise they are left out
    whole = [side for side, rows, busy in (("baseline", b_all, b_busy), ("candidate", c_all, c_busy))
             if _too_few_clean(rows, busy)]
    if whole:
        reasons = sorted({x for rows in (b_all, c_all) for x in contention_reason(rows) if x})
        detail = " and ".join(whole) + ": too few repeats clean of contention" + (f" ({'; '.join(reasons)})"
                                                                                 if reasons else "")
        return [MetricResult(case_id, metric, *NO_FIGURES, CONTENDED, detail)
                for metric in ("step_time", "throughput", "peak_memory")]
    if b_busy.any() or c_busy.any():
        excluded[case_id] = (int(b_busy.sum()), int(c_busy.sum()))
        b, c = b[~b_busy], c[~c_busy]
    if b.empty or c.empty:
        side = "baseline" if b.empty else "candidate"
        statuses = b_all if b.empty else c_all
        status = ", ".join(sorted(set(statuses["status"]))) or "absent"
        comparison.unmatched.append(f"{case_id}: no ok result in the {side} ({status})")
        return [MetricResult(case_id, "step_time", *NO_FIGURES, "not enough data", f"{side}: {status}")]
    step = _step_time(case_id, b, c, context)
    return [step, _throughput(case_id, b, c, context, step if step.ratio is not None else None),
            _peak_memory(case_id, b, c, context.memory)]


def _too_few_clean(rows: pd.DataFrame, busy: pd.Series) -> bool:
    """Did contention leave this side fewer clean repeats than a figure needs (MIN_CLEAN_PAIRS, or its one)?"""
    if rows.empty or not rows["status"].isin(["ok", "contended"]).all():
        return False
    disturbed = bool(busy.any()) or bool((rows["status"] == "contended").any())
    return disturbed and int((~busy).sum()) < min(MIN_CLEAN_PAIRS, len(rows))


def _add_notes(comparison: Comparison, excluded: dict, wanders: tuple) -> None:
    if excluded:
        comparison.notes.append("contended repeats left out (baseline, candidate): " + ", ".join(
            f"{case} ({nb}, {nc})" for case, (nb, nc) in excluded.items()))
    if any(w for w in wanders):
        shares = " and ".join(f"{w:.1%} ({side})" for side, w in zip(("baseline", "candidate"), wanders, strict=True)
                              if w)
        comparison.notes.append(f"the machine wandered {shares} (one sd of the repeats' common factor) within the "
                                "runs: added to the step-time and throughput intervals")
    unstable = [r for r in comparison.results if r.verdict == "unstable"]
    if unstable:
        widest = max(unstable, key=lambda r: r.ci_high / r.ci_low)
        comparison.notes.append(
            f"unstable: {len(unstable)} interval(s) wider than twice their -threshold..+threshold band, so a "
            f"change of the threshold's size can be neither ruled in nor out (widest: {widest.case_id} {widest.metric} "
            f"{widest.ci_low:.3f}-{widest.ci_high:.3f}); more repeats, longer windows (--target-ci, "
            "--case-budget), a quieter machine or --history TREE (the series' own noise) decide it")
    for verdict in (LOST, NEW, NOT_RUN):
        by_detail: dict[str, list[str]] = {}
        for r in comparison.results:
            if r.verdict == verdict:
                by_detail.setdefault(r.detail, []).append(r.case_id)
        comparison.notes += [f"{verdict}: {', '.join(ids)} ({detail})" for detail, ids in by_detail.items()]
    comparison.notes.append(comparison.decision)


def _status_verdict(case_id: str, b: pd.DataFrame, c: pd.DataFrame) -> MetricResult | None:
    """The verdict on a case one side or both could not run (every row `unsupported`), or None."""
    b_unsupported = not b.empty and bool((b["status"] == "unsupported").all())
    c_unsupported = not c.empty and bool((c["status"] == "unsupported").all())

    def reasons(rows: pd.DataFrame) -> str:
        found = dict.fromkeys(str(r) for r in rows.get("reason", pd.Series(dtype=object)).dropna() if str(r))
        return "; ".join(found) or "no reason recorded"
    if b_unsupported and c_unsupported:
        verdict = NOT_RUN
        detail = reasons(b) if reasons(b) == reasons(c) else \
            f"the reasons differ: baseline: {reasons(b)}; candidate: {reasons(c)}"
    elif c_unsupported and (b["status"] == "ok").any():
        verdict, detail = LOST, f"candidate: {reasons(c)}"
    elif b_unsupported and (c["status"] == "ok").any():
        verdict, detail = NEW, f"baseline: {reasons(b)}"
    else:
        return None
    return MetricResult(case_id, "status", *NO_FIGURES, verdict, detail)


def _step_samples(samples: pd.DataFrame, rows: pd.DataFrame, case_id: str) -> list[np.ndarray]:
    measured = stats.measured(samples[samples["case_id"] == case_id])
    measured = measured[measured["run_id"].isin(rows["run_id"]) & measured["repeat"].isin(rows["repeat"])]
    return [g["step_time_ms"].dropna().to_numpy(float) for _, g in measured.groupby(["run_id", "repeat"])
            if g["step_time_ms"].notna().any()]


def _too_few_repeats(n_base: int, n_cand: int) -> str:
    return (f"{n_base} baseline and {n_cand} candidate repeats: run-to-run variance unknown "
            f"(need {intervals.MIN_REPEATS} each, or --history for the series' noise floor)")


def _throughput(case_id, b, c, context: _CaseContext, step: MetricResult | None) -> MetricResult:
    """The rows' `throughput` (samples over the window's wall time, host gaps included): the ratio of
    the medians across repeats, history.run_series' point per run. Its interval by the step time's
    rule: Welch's t on the repeats' logs, the night noise and the machines' wander, and never narrower
    (in log terms) than the step time's own: throughput is the step time seen from the other side."""
    def values(rows: pd.DataFrame) -> pd.Series:
        column = rows["throughput"] if "throughput" in rows else pd.Series(dtype=float)  # typed on read
        return column[column > 0]
    base, cand = values(b), values(c)
    floor = context.floors.get(case_id)
    if base.empty or cand.empty:
        return MetricResult(case_id, "throughput", *NO_FIGURES, "not enough data", "no throughput figure on one side")
    if min(len(base), len(cand)) < intervals.MIN_REPEATS and not floor:
        return MetricResult(case_id, "throughput", *NO_FIGURES, "not enough data",
                            _too_few_repeats(len(base), len(cand)))
    bm, cm = float(base.median()), float(cand.median())
    ratio = cm / bm
    found = intervals.welch_log_interval(np.log(base), np.log(cand)) if min(len(base), len(cand)) >= 2 else None
    low, high = (found[1], found[2]) if found else (ratio, ratio)
    low, high = widen_for_wander(ratio, *intervals.widen_by_noise(ratio, low, high, floor), *context.wanders)
    if step is not None and step.ci_low and step.ci_high and step.ratio:  # the step time's width, mirrored
        low = min(low, ratio * step.ratio / step.ci_high)
        high = max(high, ratio * step.ratio / step.ci_low)
    return MetricResult(case_id, "throughput", bm, cm, ratio, low, high, None,
                        intervals.judge(low, high, context.throughput.relative, worse_when_higher=False),
                        f"{len(base)} vs {len(cand)} repeats"
                        + (f"; night noise {floor:.2%} from history" if floor else ""))


def _step_time(case_id, b, c, context: _CaseContext) -> MetricResult:
    """The ratio of the pooled medians with a bootstrap interval over repeats and their samples,
    widened to Welch's t on the repeats' medians where that is wider, then by the night noise and the
    machines' wander."""
    base_steps = _step_samples(context.base_samples, b, case_id)
    cand_steps = _step_samples(context.cand_samples, c, case_id)
    n_base, n_cand = sum(map(len, base_steps)), sum(map(len, cand_steps))
    floor = context.floors.get(case_id)
    if n_base < MIN_SAMPLES or n_cand < MIN_SAMPLES:
        return MetricResult(case_id, "step_time", *NO_FIGURES, "not enough data",
                            f"{n_base} baseline and {n_cand} candidate step samples (need {MIN_SAMPLES} each)")
    if min(len(base_steps), len(cand_steps)) < intervals.MIN_REPEATS and not floor:
        return MetricResult(case_id, "step_time", *NO_FIGURES, "not enough data",
                            _too_few_repeats(len(base_steps), len(cand_steps)))
    ratio, low, high = intervals.bootstrap_median_ratio(base_steps, cand_steps, context.rng)
    notes = [f"{n_base} vs {n_cand} steps"]
    between = intervals.repeats_interval(base_steps, cand_steps)
    if between is not None and (between[0] < low or between[1] > high):
        # the wider of the two: the repeats differ between processes more than the samples show
        low, high = min(low, between[0]), max(high, between[1])
        spread = intervals.spread_text(base_steps, cand_steps)
        notes.append(f"interval widened to the spread between repeats ({spread})")
    low, high = widen_for_wander(ratio, *intervals.widen_by_noise(ratio, low, high, floor), *context.wanders)
    notes += [f"night noise {floor:.2%} from history"] if floor else []
    p = intervals.mann_whitney_p(np.concatenate(base_steps), np.concatenate(cand_steps))
    base_median, cand_median = np.median(np.concatenate(base_steps)), np.median(np.concatenate(cand_steps))
    return MetricResult(case_id, "step_time", base_median, cand_median, ratio, low, high, p,
                        intervals.judge(low, high, context.time.relative, worse_when_higher=True), "; ".join(notes))


def _peak_memory(case_id, b, c, threshold: Threshold) -> MetricResult:
    base_mem, cand_mem = headline_memory(b).dropna(), headline_memory(c).dropna()
    if base_mem.empty or cand_mem.empty:
        return MetricResult(case_id, "peak_memory", *NO_FIGURES, "not enough data", "no peak-memory figure on one side")
    bm, cm = float(base_mem.median()), float(cand_mem.median())
    # memory is near-deterministic: the interval is the range across repeats
    low, high = float(cand_mem.min()) / float(base_mem.max()), float(cand_mem.max()) / float(base_mem.min())
    if threshold.absolute_bytes is not None:
        verdict = "regression" if cand_mem.min() - base_mem.max() > threshold.absolute_bytes else (
            "improvement" if base_mem.min() - cand_mem.max() > threshold.absolute_bytes else "no change")
    else:
        verdict = intervals.judge(low, high, threshold.relative, worse_when_higher=True)
    return MetricResult(case_id, "peak_memory", bm, cm, cm / bm if bm else None, low, high, None, verdict,
                        f"{len(base_mem)} vs {len(cand_mem)} repeats")
