"""`amp_bench history RESULTS`: the nightly series of each case on each machine, every change in it
(with dates), and which series are red now.

A series is keyed by case and machine fingerprint (host, GPU, driver, CUDA, torch), so results from
different hardware or software never form one series; each run contributes its median across
repeats (throughput: the rows' `throughput` column, the window's samples over its wall time, host
gaps included, the figure compare judges too). Each night the whole history is re-segmented
(amp_bench.analysis.gate.changepoints.detect), so past changes stay visible with the night they began, and a level that
comes back is seen. The alarm is the current state (amp_bench.analysis.gate.changepoints.state): a series is red while
its latest level is worse than its accepted level (or the recent window) beyond the threshold; a fixed regression or a
reverted spike turns green by itself. The accepted level starts at the series' first night and
moves with nightly's accepted baselines (baselines.yaml) and with annotations (annotations.yaml).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from amp_bench import identity
from amp_bench.analysis.gate import annotations as notes
from amp_bench.analysis.gate.changepoints import detect, oriented, segment, state
from amp_bench.analysis.speedups import headline_memory
from amp_bench.store.flags import text_column
from amp_bench.store.results import contended, contention_reason

# metric -> True when higher is worse
METRICS = {"step_time_ms": True, "throughput": False, "peak_mem_bytes": True}
DEFAULT_THRESHOLDS = {"step_time_ms": 0.03, "throughput": 0.03, "peak_mem_bytes": 0.02}


def series_keys() -> list[str]:
    """One series: a case (identity.case_keys: its axes and precision) on one machine (its fingerprint)."""
    return [*identity.case_keys(), "fingerprint"]


load_annotations = notes.load  # the old name


@dataclass
class Change:
    case_id: str
    fingerprint: str
    metric: str
    run_id: str  # first run of the new level
    confirmed_by: str  # the last run at the new level so far
    before: float
    after: float
    ratio: float
    kind: str  # regression | improvement
    accepted: bool = False
    note: str = ""
    date: str = ""  # the night it began
    earliest_run: str = ""  # it may have begun at any run from earliest_run to latest_run
    latest_run: str = ""
    suite: str = ""


@dataclass
class SeriesState:
    case_id: str
    fingerprint: str
    suite: str
    hostname: str
    metric: str
    red: bool
    latest_run: str
    latest_value: float
    accepted_level: float
    ratio: float = 1.0  # latest level / the level it is worse than (1.0 when green)
    against: str = ""  # accepted | recent
    since_run: str = ""  # first run of the deviation
    since_date: str = ""
    earliest_run: str = ""
    accepted_note: str = ""  # the annotation or baseline that moved the accepted level
    nights: int = 0


@dataclass
class HistoryResult:
    series: pd.DataFrame
    changes: list[Change]
    states: list[SeriesState]
    warnings: list[str] = field(default_factory=list)
    contended: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=CONTENDED_COLUMNS))

    @property
    def red(self) -> list[SeriesState]:
        """Red (case, machine, metric) states: one line each in the table."""
        return [s for s in self.states if s.red]

    @property
    def red_series(self) -> int:
        """Series (a case on a machine, series_keys) with at least one red metric: the unit the
        header's series count uses, so "N red series" and "M series" count the same thing."""
        return len({(s.case_id, s.fingerprint) for s in self.red})


def _ok_rows(results: pd.DataFrame) -> pd.DataFrame:
    """The ok rows, machine/suite/host filled in, with `_contended` and `_contention` (the machine was busy)."""
    ok = results[results["status"] == "ok"].copy()
    for column in ("suite", "hostname"):
        ok[column] = text_column(ok, column)
    ok["fingerprint"] = text_column(ok, "fingerprint").replace("", "unknown")
    ok["_contended"] = contended(ok)
    ok["_contention"] = contention_reason(ok)
    ok["timestamp"] = pd.to_datetime(ok["timestamp"], utc=True, errors="coerce", format="mixed")
    return identity.keyed(ok)


def run_series(results: pd.DataFrame) -> pd.DataFrame:
    """One row per (case, fingerprint, run): medians across the run's ok repeats, in time order.
    Contended repeats are left out (a busy machine's figures are not a point of its series)."""
    columns = [*series_keys(), "run_id", "suite", "hostname", "timestamp", *METRICS]
    ok = _ok_rows(results)
    ok = ok[~ok["_contended"]]
    if ok.empty:
        return pd.DataFrame(columns=columns)
    ok["peak_mem_bytes"] = headline_memory(ok)
    ok["step_time_ms"] = ok["step_time_ms_median"]
    table = ok.groupby([*series_keys(), "run_id"], as_index=False, sort=False, dropna=False).agg(
        suite=("suite", "first"), hostname=("hostname", "first"), timestamp=("timestamp", "min"),
        step_time_ms=("step_time_ms", "median"), throughput=("throughput", "median"),
        peak_mem_bytes=("peak_mem_bytes", "median"))
    return table.sort_values(["case_id", "fingerprint", "timestamp", "run_id"]).reset_index(drop=True)[columns]


CONTENDED_COLUMNS = ["case_id", "fingerprint", "run_id", "suite", "hostname", "timestamp", "contention", "latest"]


def contended_runs(results: pd.DataFrame) -> pd.DataFrame:
    """(case, fingerprint, run) whose ok repeats were all contended: left out of the series, listed."""
    if results.empty or not (contended(results) & (results["status"] == "ok")).any():
        return pd.DataFrame(columns=CONTENDED_COLUMNS)
    table = _ok_rows(results).groupby([*series_keys(), "run_id"], as_index=False, sort=False, dropna=False).agg(
        suite=("suite", "first"), hostname=("hostname", "first"), timestamp=("timestamp", "min"),
        all_contended=("_contended", "all"),
        contention=("_contention", lambda r: "; ".join(sorted({x for x in r if x})) or "contended"))
    table = table[table["all_contended"]].copy()
    # latest: no judged run of the series after it (tonight's run was contended: not judged)
    judged = run_series(results).groupby(series_keys(), dropna=False, as_index=False)["timestamp"].max()
    after = table.merge(judged.rename(columns={"timestamp": "_judged"}), on=series_keys(), how="left")["_judged"]
    table["latest"] = [pd.isna(a) or pd.isna(t) or t > a for a, t in zip(after, table["timestamp"], strict=True)]
    return table.sort_values(["timestamp", "run_id", "case_id"]).reset_index(drop=True)[CONTENDED_COLUMNS]


def day_text(value) -> str:
    """A run's timestamp as its day (YYYY-MM-DD), "" where the time is unknown: the history and nightly say it."""
    return value.strftime("%Y-%m-%d") if isinstance(value, pd.Timestamp) and not pd.isna(value) else ""


def _anchor(values: np.ndarray, higher_is_worse: bool, threshold: float, index: int) -> int:
    """Where the accepted level begins when the run at `index` is accepted: the start of its segment,
    or of the deviation it was part of."""
    starts = [0] + [b for b, _, _ in segment(oriented(values[:index + 1], higher_is_worse), threshold)]
    st = state(values[:index + 1], threshold, higher_is_worse)
    return max(max(starts), st.start if st.red else 0)


def evaluate(results: pd.DataFrame, annotations: list[dict] | None = None,
             thresholds: dict[str, float] | None = None, baselines: dict[tuple[str, str], str] | None = None,
             annotations_path: Path | None = None) -> HistoryResult:
    """baselines: (fingerprint, suite) -> the accepted run id (from nightly's baselines.yaml)."""
    thresholds = {**DEFAULT_THRESHOLDS, **(thresholds or {})}
    series = run_series(results)
    entries = notes.resolve(list(annotations or []), series.groupby("run_id")["timestamp"].min())
    changes: list[Change] = []
    states: list[SeriesState] = []
    for _, group in series.groupby(series_keys(), sort=False, dropna=False):
        case_id, fingerprint = str(group["case_id"].iloc[0]), str(group["fingerprint"].iloc[0])
        suite, host = str(group["suite"].iloc[-1]), str(group["hostname"].iloc[-1])
        for metric, higher_is_worse in METRICS.items():
            raw = group[metric].to_numpy(float)
            keep = np.isfinite(raw) & (raw > 0)
            if keep.sum() < 2:
                continue
            one = _Series(case_id, fingerprint, suite, host, metric, higher_is_worse, thresholds[metric], raw[keep],
                          group["run_id"].to_numpy()[keep],
                          [d for d, k in zip(group["timestamp"], keep, strict=True) if k], entries,
                          (baselines or {}).get((fingerprint, suite)))
            found, current = one.judge()
            changes += found
            states.append(current)
    warnings = notes.unmatched(entries, annotations_path)
    states.sort(key=lambda s: (not s.red, s.fingerprint, s.case_id, s.metric))
    return HistoryResult(series, changes, states, warnings, contended_runs(results))


@dataclass
class _Series:
    """One case's metric on one machine, night by night: its change points and its current state, with
    the accepted baseline run and the annotations that cover a change."""
    case_id: str
    fingerprint: str
    suite: str
    host: str
    metric: str
    higher_is_worse: bool
    threshold: float
    values: np.ndarray
    runs: np.ndarray
    dates: list
    entries: list
    base_run: str | None

    def covering(self, start: int, earliest: int, latest: int) -> dict | None:
        return notes.covering(self.entries, case_id=self.case_id, fingerprint=self.fingerprint, hostname=self.host,
                              suite=self.suite, metric=self.metric, start_run=self.runs[start],
                              earliest=self.dates[earliest], latest=self.dates[latest])

    def judge(self) -> tuple[list[Change], SeriesState]:
        anchor, accepted_note = 0, ""
        if self.base_run is not None and self.base_run in set(self.runs):
            anchor = _anchor(self.values, self.higher_is_worse, self.threshold,
                             int(np.flatnonzero(self.runs == self.base_run)[0]))
            accepted_note = f"accepted baseline {self.base_run}"
        changes = []
        for point in detect(self.values, self.threshold, self.higher_is_worse):
            change, entry = self.change(point), self.covering(point.index, point.earliest, point.latest)
            if entry is not None:
                change.accepted, change.note = True, str(entry.get("note", ""))
                if point.index > anchor:
                    anchor, accepted_note = point.index, f"annotation {entry['_name']}"
            changes.append(change)
        return changes, self.current(anchor, accepted_note)

    def change(self, point) -> Change:
        worse = point.after > point.before if self.higher_is_worse else point.after < point.before
        return Change(self.case_id, self.fingerprint, self.metric, self.runs[point.index],
                      self.runs[point.confirmed_at], point.before, point.after, point.ratio,
                      "regression" if worse else "improvement", date=day_text(self.dates[point.index]),
                      earliest_run=self.runs[point.earliest], latest_run=self.runs[point.latest], suite=self.suite)

    def current(self, anchor: int, accepted_note: str) -> SeriesState:
        values = self.values
        current = state(values, self.threshold, self.higher_is_worse, anchor=anchor)
        for _ in range(3):  # an annotation may cover the deviation itself
            if not current.red:
                break
            entry = self.covering(current.start, current.earliest, current.latest)
            if entry is None or current.start <= anchor:
                break
            anchor, accepted_note = current.start, f"annotation {entry['_name']}"
            current = state(values, self.threshold, self.higher_is_worse, anchor=anchor)
        accepted_level = float(np.median(values[anchor:max(anchor + 1, min(len(values) - 2, anchor + 30))]))
        st = SeriesState(self.case_id, self.fingerprint, self.suite, self.host, self.metric, current.red, self.runs[-1],
                         float(values[-1]), accepted_level, current.ratio, current.against,
                         accepted_note=accepted_note, nights=current.nights)
        if current.red:
            st.since_run, st.since_date = self.runs[current.start], day_text(self.dates[current.start])
            st.earliest_run = self.runs[current.earliest]
        return st


def analyse(results: pd.DataFrame, annotations: list[dict] | None = None,
            thresholds: dict[str, float] | None = None) -> tuple[pd.DataFrame, list[Change]]:
    result = evaluate(results, annotations, thresholds)
    return result.series, result.changes


def alerts(changes: list[Change]) -> list[Change]:
    """Past regressions no annotation accepted (whether or not they still stand)."""
    return [c for c in changes if c.kind == "regression" and not c.accepted]


def to_json(result: HistoryResult, max_series_rows: int = 20000) -> str:
    series = result.series
    payload = {"red": len(result.red), "alerts": [asdict(s) for s in result.red],
               "changes": [asdict(c) for c in result.changes], "warnings": result.warnings,
               "states": [asdict(s) for s in result.states], "contended": contended_records(result.contended)}
    if len(series) <= max_series_rows:
        stamped = series.assign(timestamp=series["timestamp"].astype(str))
        payload["series"] = json.loads(stamped.to_json(orient="records"))
    return json.dumps(payload, indent=2, default=str)


def contended_records(table: pd.DataFrame) -> list[dict]:
    """The contended runs as JSON records (timestamps as text): history's and nightly's JSON."""
    return json.loads(table.assign(timestamp=table["timestamp"].astype(str)).to_json(orient="records"))


TONIGHT_CONTENDED = "tonight's run was contended: not judged"


def contended_lines(table: pd.DataFrame, limit: int = 50) -> list[str]:
    """Markdown lines listing runs left out as contended (empty when none)."""
    if table.empty:
        return []
    lines = ["## Contended runs: not judged", "",
             "A contended run's figures are not comparable; they are left out of the series.", "",
             "| date | run | machine | case | contention | |", "|---|---|---|---|---|---|"]
    shown = table.iloc[::-1].head(limit)
    for _, r in shown.iterrows():
        lines.append(f"| {day_text(r['timestamp'])} | {r['run_id']} | {r['hostname'] or r['fingerprint']} | "
                     f"{r['case_id']} | {r['contention']} | "
                     f"{TONIGHT_CONTENDED if r['latest'] else 'left out of the series'} |")
    if len(table) > limit:
        lines.append(f"\n{len(table) - limit} older contended runs in the JSON output.")
    return lines + [""]


def _pct(ratio: float) -> str:
    return f"{ratio - 1:+.1%}"


def to_markdown(result: HistoryResult, max_changes: int = 200) -> str:
    series = result.series
    lines = [f"# amp_bench history: {result.red_series} red series ({len(result.red)} red metrics)", "",
             f"{series[series_keys()].drop_duplicates().shape[0]} series, {series['run_id'].nunique()} runs, "
             f"{len(result.changes)} changes in their history.", ""]
    lines += [f"- warning: {w}" for w in result.warnings] + ([""] if result.warnings else [])
    if result.red:
        lines += ["## Red now", "", "| case | machine | metric | since | may have begun | latest vs level | against |",
                  "|---|---|---|---|---|---|---|"]
        for s in result.red:
            lines.append(f"| {s.case_id} | {s.hostname or s.fingerprint} ({s.fingerprint}) | {s.metric} | "
                         f"{s.since_date} ({s.since_run}) | {s.earliest_run} | {_pct(s.ratio)} | {s.against} |")
        lines.append("")
    else:
        lines += ["Every series is at its accepted level.", ""]
    lines += contended_lines(result.contended)
    if result.changes:
        shown = sorted(result.changes, key=lambda c: c.date, reverse=True)[:max_changes]
        lines += ["## Changes in the history (newest first)", "",
                  "| date | case | machine | metric | from run | before | after | change | kind | accepted |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for c in shown:
            lines.append(f"| {c.date} | {c.case_id} | {c.fingerprint} | {c.metric} | {c.run_id} | {c.before:.4g} | "
                         f"{c.after:.4g} | {_pct(c.ratio)} | {c.kind} | {'yes: ' + c.note if c.accepted else 'no'} |")
        if len(result.changes) > max_changes:
            lines.append(f"\n{len(result.changes) - max_changes} older changes in the JSON output.")
    else:
        lines.append("No change in any series.")
    return "\n".join(lines) + "\n"


def history_noise(tree: str | Path, fingerprints: set[str]) -> dict[str, float]:
    """Night-to-night noise of each case's step-time series in a results tree (same machine)."""
    from amp_bench.analysis.gate.changepoints import noise_scale
    from amp_bench.store.cache import load_cached
    series = run_series(load_cached([tree]))
    if fingerprints:
        series = series[series["fingerprint"].isin(fingerprints)]
    out = {}
    for _, g in series.groupby(identity.case_keys(), dropna=False):
        values = g["step_time_ms"].dropna().to_numpy(float)
        if len(values) >= 6:
            out[g["case_id"].iloc[0]] = noise_scale(np.log(values[values > 0]), 0.0)
    return out
