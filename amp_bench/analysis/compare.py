"""`amp_bench compare BASELINE CANDIDATE`: is the candidate slower, or does it use more memory?

For each case both sides ran, the ratio (candidate / baseline) of:
- step time: the medians of the per-step samples, with a bootstrap confidence interval that
  resamples repeats and the samples within them, widened where Welch's t on the repeats' own medians
  gives a wider one (the repeats are separate processes, which on a VM differ more than the steps
  within one do), and a Mann-Whitney U test;
- throughput: the rows' `throughput` column, the one definition (samples over the measured window's
  wall time, host gaps included: stats.Window), as history and nightly use it: the median across
  each side's repeats (history.run_series' point per run), with the range across repeats as interval;
- peak memory: the median across repeats, with the range across repeats as interval.
A regression is called only when the whole interval lies beyond the threshold, so noise alone does
not alert. A case the hardware cannot run (status `unsupported`) on both sides is "not run on either
side" (neutral); one the baseline ran and the candidate cannot is "unsupported in candidate" (a
finding: exit 1); one only the candidate runs is "new in candidate" (neutral).
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from amp_bench import stats
from amp_bench.analysis.intervals import (BOOTSTRAP, MIN_REPEATS, _spread, _widen,  # noqa: F401 (re-exported)
                                          bootstrap_median_ratio, judge, mann_whitney_p, repeats_interval)
from amp_bench.analysis.compare_outputs import to_json, to_junit, to_markdown, write_outputs  # noqa: F401 (re-exported)
from amp_bench.errors import UserError
from amp_bench.store.results import contended, contention_reason
from amp_bench.analysis.speedups import headline_memory

EXIT_OK, EXIT_REGRESSION, EXIT_USAGE, EXIT_NO_DATA, EXIT_UNSTABLE = 0, 1, 2, 3, 4
MIN_SAMPLES = 5  # per side, for a time comparison


@dataclass(frozen=True)
class Threshold:
    """'3%' (relative) or '0B' / '64MiB' (absolute bytes, memory only)."""
    relative: float | None = None
    absolute_bytes: int | None = None

    @classmethod
    def parse(cls, text: str, what: str, allow_bytes: bool = False) -> Threshold:
        text = str(text).strip()
        match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*%", text)
        if match:
            return cls(relative=float(match.group(1)) / 100)
        units = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
        match = re.fullmatch(r"(\d+)\s*(B|KiB|MiB|GiB)", text)
        if match and allow_bytes:
            return cls(absolute_bytes=int(match.group(1)) * units[match.group(2)])
        expected = "a percentage like 3%" + (" or a size like 0B / 64MiB" if allow_bytes else "")
        raise UserError(f"--threshold-{what}: expected {expected}, got {text!r}")

    def __str__(self) -> str:
        return f"{self.relative:.1%}" if self.relative is not None else f"{self.absolute_bytes} B"


@dataclass
class MetricResult:
    case_id: str
    metric: str  # step_time | throughput | peak_memory
    baseline: float | None
    candidate: float | None
    ratio: float | None
    ci_low: float | None
    ci_high: float | None
    p_value: float | None
    verdict: str  # regression | improvement | no change | unstable | not enough data | not comparable (contended)
    #               | not run on either side | unsupported in candidate | new in candidate (these: metric "status")
    detail: str = ""


CONTENDED = "not comparable (contended)"  # every repeat of a case on one side ran on a busy machine (issue 12)
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
        if "unstable" in verdicts:
            return EXIT_UNSTABLE
        return EXIT_OK

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


def _fingerprints(results: pd.DataFrame) -> set[str]:
    if "fingerprint" not in results:
        return set()
    return set(results["fingerprint"].dropna().astype(str))


def compare(baseline: list[str], candidate: list[str], *, threshold_time: Threshold = Threshold(0.03),
            threshold_throughput: Threshold | None = None, threshold_memory: Threshold = Threshold(0.02),
            force: bool = False, seed: int = 0, noise_floor: dict[str, float] | None = None,
            history: str | Path | None = None) -> Comparison:
    """noise_floor: case id -> night-to-night noise of its series (log units), or history: a results
    tree to take it from (the candidate's machine): widens each interval by that run-to-run
    variance, and lets fewer than MIN_REPEATS repeats decide."""
    threshold_throughput = threshold_throughput or threshold_time
    base_rows, base_samples = _load_side(baseline)
    cand_rows, cand_samples = _load_side(candidate)
    base_fp, cand_fp = _fingerprints(base_rows), _fingerprints(cand_rows)
    comparison = Comparison([str(b) for b in baseline], [str(c) for c in candidate],
                            {"step_time": str(threshold_time), "throughput": str(threshold_throughput),
                             "peak_memory": str(threshold_memory)})
    if base_fp and cand_fp and base_fp != cand_fp:
        message = (f"machine fingerprints differ (baseline {', '.join(sorted(base_fp))}, candidate "
                   f"{', '.join(sorted(cand_fp))}): different hardware or software")
        if not force:
            raise UserError(message + "; pass --force to compare anyway")
        comparison.notes.append(message + " (compared anyway: --force)")
    elif not base_fp or not cand_fp:
        comparison.notes.append("results without a machine fingerprint: could not check they come from the same "
                                "machine and software")
    if history is not None:
        noise_floor = {**history_noise(history, cand_fp), **(noise_floor or {})}
        comparison.notes.append(f"night-to-night noise of {len(noise_floor)} series from {history} added to the intervals")
    rng = np.random.default_rng(seed)
    base_ok = base_rows[base_rows["status"] == "ok"]
    cand_ok = cand_rows[cand_rows["status"] == "ok"]
    base_busy, cand_busy = contended(base_ok), contended(cand_ok)
    cases = list(dict.fromkeys(list(base_rows["case_id"]) + list(cand_rows["case_id"])))
    excluded: dict[str, tuple[int, int]] = {}
    for case_id in cases:
        status = _status_verdict(case_id, base_rows, cand_rows)
        if status is not None:
            comparison.results.append(status)
            continue
        b, c = base_ok[base_ok["case_id"] == case_id], cand_ok[cand_ok["case_id"] == case_id]
        # contended repeats are not comparable: a side with nothing else has no verdict (exit 3),
        # otherwise they are left out (and the notes say how many)
        b_busy, c_busy = base_busy[b.index], cand_busy[c.index]
        whole = [side for side, rows, busy in (("baseline", b, b_busy), ("candidate", c, c_busy))
                 if not rows.empty and busy.all()]
        if whole:
            reasons = sorted({x for rows in (b, c) for x in contention_reason(rows) if x})
            detail = (" and ".join(whole) + ": every repeat contended"
                      + (f" ({'; '.join(reasons)})" if reasons else ""))
            for metric in ("step_time", "throughput", "peak_memory"):
                comparison.results.append(MetricResult(case_id, metric, None, None, None, None, None, None,
                                                       CONTENDED, detail))
            continue
        if b_busy.any() or c_busy.any():
            excluded[case_id] = (int(b_busy.sum()), int(c_busy.sum()))
            b, c = b[~b_busy], c[~c_busy]
        if b.empty or c.empty:
            side = "baseline" if b.empty else "candidate"
            statuses = (base_rows if b.empty else cand_rows)
            status = ", ".join(sorted(set(statuses.loc[statuses["case_id"] == case_id, "status"]))) or "absent"
            comparison.unmatched.append(f"{case_id}: no ok result in the {side} ({status})")
            comparison.results.append(MetricResult(case_id, "step_time", None, None, None, None, None, None,
                                                   "not enough data", f"{side}: {status}"))
            continue
        comparison.results.extend(_compare_case(case_id, b, c, base_samples, cand_samples, rng,
                                                threshold_time, threshold_throughput, threshold_memory,
                                                (noise_floor or {}).get(case_id)))
    if excluded:
        comparison.notes.append("contended repeats left out (baseline, candidate): " + ", ".join(
            f"{case} ({nb}, {nc})" for case, (nb, nc) in excluded.items()))
    unstable = [r for r in comparison.results if r.verdict == "unstable"]
    if unstable:
        widest = max(unstable, key=lambda r: r.ci_high / r.ci_low)
        comparison.notes.append(
            f"unstable: {len(unstable)} interval(s) wider than 4x their threshold, so a change of the threshold's "
            f"size can be neither ruled in nor out (widest: {widest.case_id} {widest.metric} "
            f"{widest.ci_low:.3f}-{widest.ci_high:.3f}); more repeats, longer windows (--target-ci, "
            "--case-budget), a quieter machine or --history TREE (the series' own noise) decide it")
    for verdict in (LOST, NEW, NOT_RUN):
        by_detail: dict[str, list[str]] = {}
        for r in comparison.results:
            if r.verdict == verdict:
                by_detail.setdefault(r.detail, []).append(r.case_id)
        comparison.notes += [f"{verdict}: {', '.join(ids)} ({detail})" for detail, ids in by_detail.items()]
    return comparison


def _status_verdict(case_id: str, base_rows: pd.DataFrame, cand_rows: pd.DataFrame) -> MetricResult | None:
    """The verdict on a case one side or both could not run (every row `unsupported`), or None."""
    b, c = base_rows[base_rows["case_id"] == case_id], cand_rows[cand_rows["case_id"] == case_id]
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
    return MetricResult(case_id, "status", None, None, None, None, None, None, verdict, detail)


def _step_samples(samples: pd.DataFrame, rows: pd.DataFrame, case_id: str) -> list[np.ndarray]:
    measured = stats.measured(samples[samples["case_id"] == case_id])
    measured = measured[measured["run_id"].isin(rows["run_id"]) & measured["repeat"].isin(rows["repeat"])]
    return [g["step_time_ms"].dropna().to_numpy(float) for _, g in measured.groupby(["run_id", "repeat"])
            if g["step_time_ms"].notna().any()]


def history_noise(tree: str | Path, fingerprints: set[str]) -> dict[str, float]:
    """Night-to-night noise of each case's step-time series in a results tree (same machine)."""
    from amp_bench.analysis.gate.changepoints import noise_scale
    from amp_bench.analysis.gate.history import run_series
    from amp_bench.store.cache import load_cached
    series = run_series(load_cached([tree]))
    if fingerprints:
        series = series[series["fingerprint"].isin(fingerprints)]
    out = {}
    for case_id, g in series.groupby("case_id"):
        values = g["step_time_ms"].dropna().to_numpy(float)
        if len(values) >= 6:
            out[case_id] = noise_scale(np.log(values[values > 0]), 0.0)
    return out


def _too_few_repeats(n_base: int, n_cand: int) -> str:
    return (f"{n_base} baseline and {n_cand} candidate repeats: run-to-run variance unknown "
            f"(need {MIN_REPEATS} each, or --history for the series' noise floor)")


def _throughput(case_id, b, c, threshold: Threshold, floor: float | None) -> MetricResult:
    """The rows' `throughput` (samples over the window's wall time, host gaps included): the ratio of
    the medians across repeats, history.run_series' point per run; the interval is the range across
    repeats (lowest candidate / highest baseline .. highest / lowest), widened by the noise floor."""
    def values(rows: pd.DataFrame) -> pd.Series:
        column = pd.to_numeric(rows["throughput"], errors="coerce") if "throughput" in rows else pd.Series(dtype=float)
        return column[column > 0]
    base, cand = values(b), values(c)
    if base.empty or cand.empty:
        return MetricResult(case_id, "throughput", None, None, None, None, None, None, "not enough data",
                            "no throughput figure on one side")
    if min(len(base), len(cand)) < MIN_REPEATS and not floor:
        return MetricResult(case_id, "throughput", None, None, None, None, None, None, "not enough data",
                            _too_few_repeats(len(base), len(cand)))
    bm, cm = float(base.median()), float(cand.median())
    low, high = _widen(cm / bm, float(cand.min()) / float(base.max()), float(cand.max()) / float(base.min()), floor)
    return MetricResult(case_id, "throughput", bm, cm, cm / bm, low, high, None,
                        judge(low, high, threshold.relative, worse_when_higher=False),
                        f"{len(base)} vs {len(cand)} repeats"
                        + (f"; night noise {floor:.2%} from history" if floor else ""))


def _compare_case(case_id, b, c, base_samples, cand_samples, rng, t_time, t_tput, t_mem,
                  floor: float | None = None) -> list[MetricResult]:
    out = []
    base_steps, cand_steps = _step_samples(base_samples, b, case_id), _step_samples(cand_samples, c, case_id)
    n_base, n_cand = sum(map(len, base_steps)), sum(map(len, cand_steps))
    if n_base < MIN_SAMPLES or n_cand < MIN_SAMPLES:
        out.append(MetricResult(case_id, "step_time", None, None, None, None, None, None, "not enough data",
                                f"{n_base} baseline and {n_cand} candidate step samples (need {MIN_SAMPLES} each)"))
    elif min(len(base_steps), len(cand_steps)) < MIN_REPEATS and not floor:
        out.append(MetricResult(case_id, "step_time", None, None, None, None, None, None, "not enough data",
                                _too_few_repeats(len(base_steps), len(cand_steps))))
    else:
        ratio, low, high = bootstrap_median_ratio(base_steps, cand_steps, rng)
        notes = []
        between = repeats_interval(base_steps, cand_steps)
        if between is not None and (between[0] < low or between[1] > high):
            # the wider of the two: the repeats differ between processes more than the samples show
            low, high = min(low, between[0]), max(high, between[1])
            notes.append(f"interval widened to the spread between repeats ({_spread(base_steps, cand_steps)})")
        low, high = _widen(ratio, low, high, floor)
        p = mann_whitney_p(np.concatenate(base_steps), np.concatenate(cand_steps))
        base_median, cand_median = np.median(np.concatenate(base_steps)), np.median(np.concatenate(cand_steps))
        out.append(MetricResult(case_id, "step_time", base_median, cand_median, ratio, low, high, p,
                                judge(low, high, t_time.relative, worse_when_higher=True),
                                "; ".join([f"{n_base} vs {n_cand} steps", *notes]
                                          + ([f"night noise {floor:.2%} from history"] if floor else []))))
    out.append(_throughput(case_id, b, c, t_tput, floor))
    base_mem, cand_mem = headline_memory(b).dropna(), headline_memory(c).dropna()
    if base_mem.empty or cand_mem.empty:
        out.append(MetricResult(case_id, "peak_memory", None, None, None, None, None, None, "not enough data",
                                "no peak-memory figure on one side"))
        return out
    bm, cm = float(base_mem.median()), float(cand_mem.median())
    # memory is near-deterministic: the interval is the range across repeats
    low, high = float(cand_mem.min()) / float(base_mem.max()), float(cand_mem.max()) / float(base_mem.min())
    if t_mem.absolute_bytes is not None:
        verdict = "regression" if cand_mem.min() - base_mem.max() > t_mem.absolute_bytes else (
            "improvement" if base_mem.min() - cand_mem.max() > t_mem.absolute_bytes else "no change")
    else:
        verdict = judge(low, high, t_mem.relative, worse_when_higher=True)
    out.append(MetricResult(case_id, "peak_memory", bm, cm, cm / bm if bm else None, low, high, None, verdict,
                            f"{len(base_mem)} vs {len(cand_mem)} repeats"))
    return out


# ----------------------------------------------------------------------------- outputs

def to_frame(comparison: Comparison) -> pd.DataFrame:
    return pd.DataFrame([asdict(r) for r in comparison.results],
                        columns=list(MetricResult.__dataclass_fields__))
