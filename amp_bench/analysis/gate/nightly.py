"""`amp_bench nightly RESULTS_TREE`: one gate for a shared, append-only results tree.

For each machine fingerprint and suite: tonight's run (the latest) against that series' accepted
baseline and its history. One markdown / JSON / JUnit output and one exit code: 0 all green, 1 a
series is red, 3 a machine or suite has no verdict tonight (a case missing, a machine that stopped
reporting, a run marked contended: its figures are not comparable, so it is left out of the series
and listed, not judged). The table counts cases in both columns: `series` the cases judged tonight,
`red` those of them with at least one red metric (the red metrics are listed below it). `--accept`
moves the accepted baseline of the matching machines and suites to tonight's run (never to a wholly
contended one); baselines live in baselines.yaml at the root of the tree:

    - {machine: 3f9a0c1d2e4b, suite: resnet50, run: 20261130T020000Z-node-a-cuda, accepted: 2026-11-30, note: ...}
"""
from __future__ import annotations

import datetime as dt
import fnmatch
import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pandas as pd
import yaml

from amp_bench.analysis import junit
from amp_bench.analysis.gate import annotations as notes
from amp_bench.analysis.gate.history import HistoryResult, contended_records, day_text, evaluate
from amp_bench.analysis.junit import TestCase
from amp_bench.errors import UserError
from amp_bench.store.results import write_text_atomic

BASELINES_FILE = "baselines.yaml"
ANNOTATIONS_FILE = "annotations.yaml"
EXIT_OK, EXIT_RED, EXIT_NO_DATA = 0, 1, 3


@dataclass
class Group:
    fingerprint: str
    hostname: str
    suite: str
    tonight: str
    date: str
    baseline: str  # accepted run ("" = the series' first night)
    series: int = 0  # cases judged tonight (a case's series on this machine)
    red: int = 0  # of them, cases with at least one red metric
    cases: int = 0  # cases in tonight's run, contended ones included
    missing: list[str] = field(default_factory=list)  # cases of the previous run absent tonight
    stale: bool = False  # its latest run is older than the tree's by more than max_age_days
    contended: list[str] = field(default_factory=list)  # cases whose run tonight was contended: not judged
    contention: str = ""  # the reason recorded with them
    unfinished: str = ""  # tonight's run is not complete (interrupted: a killed parent, ended jobs; or still running)


@dataclass
class NightlyResult:
    root: str
    history: HistoryResult
    groups: list[Group]

    @property
    def red(self):
        tonight = {(g.fingerprint, g.suite, g.tonight) for g in self.groups}
        return [s for s in self.history.red if (s.fingerprint, s.suite, s.latest_run) in tonight]

    @property
    def red_cases(self) -> int:
        """Cases (machine, suite, case) with at least one red metric tonight: what the table's `red` adds up."""
        return len({(s.fingerprint, s.suite, s.case_id) for s in self.red})

    @property
    def exit_code(self) -> int:
        if self.red:
            return EXIT_RED
        if any(g.missing or g.stale or g.contended or g.unfinished for g in self.groups):
            return EXIT_NO_DATA
        return EXIT_OK

    @property
    def summary(self) -> str:
        return {EXIT_OK: "all green", EXIT_RED: f"{self.red_cases} red series",
                EXIT_NO_DATA: "no verdict for some machines or suites"}[self.exit_code]


def load_baselines(root: Path) -> list[dict]:
    path = Path(root) / BASELINES_FILE
    if not path.exists():
        return []
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or []
    except yaml.YAMLError as exc:
        raise UserError(f"{path}: invalid YAML: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(data, list):
        raise UserError(f"{path}: expected a list of baselines, got {type(data).__name__}")
    for i, entry in enumerate(data):
        if not isinstance(entry, dict):
            raise UserError(f"{path}: [{i}]: expected a mapping with machine, suite and run, got {entry!r}")
        for key in ("machine", "suite", "run"):
            if not entry.get(key):
                raise UserError(f"{path}: [{i}].{key}: missing")
    return data


def _groups(series: pd.DataFrame, contended: pd.DataFrame, baselines: dict, max_age_days: float) -> list[Group]:
    """Tonight's run of each machine and suite, contended runs included (they are tonight's run, not
    judged: exit 3), with the cases missing since the run before."""
    columns = ["fingerprint", "suite", "run_id", "timestamp", "hostname", "case_id"]
    every = pd.concat([series[columns], contended[columns]], ignore_index=True) if not contended.empty \
        else series[columns]
    runs = every.groupby(["fingerprint", "suite", "run_id"], sort=False).agg(
        timestamp=("timestamp", "min"), hostname=("hostname", "first"), cases=("case_id", lambda c: set(c)))
    runs = runs.reset_index().sort_values(["timestamp", "run_id"])
    busy = {key: g for key, g in contended.groupby(["fingerprint", "suite", "run_id"])} if not contended.empty else {}
    newest = runs["timestamp"].max()
    out = []
    for (fp, suite), g in runs.groupby(["fingerprint", "suite"], sort=True):
        last = g.iloc[-1]
        group = Group(fp, str(last["hostname"]), suite, last["run_id"], day_text(last["timestamp"]),
                      baselines.get((fp, suite), ""), cases=len(last["cases"]))
        if len(g) > 1:
            group.missing = sorted(g.iloc[-2]["cases"] - last["cases"])
        tonight_busy = busy.get((fp, suite, last["run_id"]))
        if tonight_busy is not None:
            group.contended = sorted(set(tonight_busy["case_id"]))
            group.contention = "; ".join(sorted(set(tonight_busy["contention"]) - {""}))
        if not pd.isna(newest) and not pd.isna(last["timestamp"]):
            group.stale = (newest - last["timestamp"]) > pd.Timedelta(days=max_age_days)
        out.append(group)
    return out


def nightly(root: str | Path, thresholds: dict[str, float] | None = None, max_age_days: float = 2.0,
            annotations_path: Path | None = None, use_cache: bool = True) -> NightlyResult:
    from amp_bench.store.cache import load_tree
    root = Path(root)
    results = load_tree(root, use_cache)
    annotations_path = annotations_path or (root / ANNOTATIONS_FILE)
    baselines = {(str(b["machine"]), str(b["suite"])): str(b["run"]) for b in load_baselines(root)}
    history = evaluate(results, notes.load(annotations_path), thresholds, baselines,
                       annotations_path if annotations_path.exists() else None)
    if history.series.empty:
        raise UserError(f"{root}: no ok result in any run (nothing to judge)")
    groups = _groups(history.series, history.contended, baselines, max_age_days)
    result = NightlyResult(str(root), history, groups)
    # one count in both columns: cases judged tonight, and those of them with a red metric
    judged = Counter(key[:3] for key in {(s.fingerprint, s.suite, s.latest_run, s.case_id) for s in history.states})
    red = Counter(key[:2] for key in {(s.fingerprint, s.suite, s.case_id) for s in result.red})
    for g in groups:
        g.series, g.red = judged[(g.fingerprint, g.suite, g.tonight)], red[(g.fingerprint, g.suite)]
    _mark_unfinished(root, groups)
    return result


def _mark_unfinished(root: Path, groups: list[Group]) -> None:
    """A tonight whose run did not finish (its parent killed, its jobs ended with cases left, or still
    going) has no verdict: its rows are judged as far as they go, and the run is named (exit 3)."""
    from amp_bench.store.results import find_runs
    from amp_bench.store.run_state import run_state
    tonight = {g.tonight for g in groups}
    try:
        dirs = {d.name: d for d in find_runs(root) if d.name in tonight}
    except UserError:  # runs without manifests (copied tables): nothing says they did not finish
        return
    for g in groups:
        if g.tonight in dirs:
            state = run_state(dirs[g.tonight])
            if state.state not in ("complete", "unknown"):
                g.unfinished = f"{state.state}: {state.detail}"


def accept(root: str | Path, machine: str | None = None, suite: str | None = None, note: str = "",
           use_cache: bool = True) -> list[dict]:
    """Move the accepted baseline of matching machines (fingerprint or host glob) and suites to
    their latest run; returns the new entries."""
    root = Path(root)
    current = nightly(root, use_cache=use_cache)
    entries = {(str(b["machine"]), str(b["suite"])): b for b in load_baselines(root)}
    moved, skipped = [], []
    for g in current.groups:
        if machine and not (fnmatch.fnmatchcase(g.fingerprint, machine) or fnmatch.fnmatchcase(g.hostname, machine)):
            continue
        if suite and not fnmatch.fnmatchcase(g.suite, suite):
            continue
        if g.contended and len(g.contended) >= g.cases:  # not comparable: no baseline either
            skipped.append(f"{g.hostname or g.fingerprint} {g.suite}")
            continue
        entry = {"machine": g.fingerprint, "host": g.hostname, "suite": g.suite, "run": g.tonight,
                 "accepted": dt.date.today().isoformat(), "note": note}
        entries[(g.fingerprint, g.suite)] = entry
        moved.append(entry)
    if not moved:
        busy = f"; tonight's run was contended for {', '.join(skipped)}" if skipped else ""
        raise UserError(f"{root}: --accept matched no machine and suite (machine {machine or '*'}, "
                        f"suite {suite or '*'}){busy}")
    text = ("# accepted baselines, one per machine fingerprint and suite (amp_bench nightly --accept)\n"
            + yaml.safe_dump(list(entries.values()), sort_keys=False))
    write_text_atomic(root / BASELINES_FILE, text)
    return moved


# ----------------------------------------------------------------------------- outputs

def to_markdown(result: NightlyResult) -> str:
    lines = [f"# amp_bench nightly: {result.summary}", "", f"results: {result.root}", "",
             "| machine | suite | tonight | date | accepted baseline | series | red | no verdict |",
             "|---|---|---|---|---|---|---|---|"]
    for g in sorted(result.groups, key=lambda g: (-g.red, g.hostname, g.suite)):
        missing = ("stale; " if g.stale else "") + (", ".join(g.missing[:5]) + ("..." if len(g.missing) > 5 else ""))
        if g.contended:
            missing += ("; " if missing else "") + f"contended: {len(g.contended)} cases"
        if g.unfinished:
            missing += ("; " if missing else "") + f"run {g.unfinished.split(':')[0]}"
        lines.append(f"| {g.hostname or '?'} ({g.fingerprint}) | {g.suite} | {g.tonight} | {g.date} | "
                     f"{g.baseline or 'first night'} | {g.series} | {g.red} | {missing or '-'} |")
    lines += [""] + [f"- warning: {w}" for w in result.history.warnings]
    unfinished = [g for g in result.groups if g.unfinished]
    if unfinished:
        lines += ["", "## Tonight's run did not finish: no verdict", ""]
        lines += [f"- {g.hostname or g.fingerprint} {g.suite}: {g.tonight} is {g.unfinished}" for g in unfinished]
    busy = [g for g in result.groups if g.contended]
    if busy:
        lines += ["", "## Contended tonight: not judged", ""]
        for g in busy:
            lines.append(f"- {g.hostname or g.fingerprint} {g.suite}: tonight's run {g.tonight} was contended "
                         f"({g.contention or 'no reason recorded'}): not judged for {', '.join(g.contended)}")
    if result.red:
        lines += ["", "## Red", "", "| machine | case | metric | since | tonight vs level | against |",
                  "|---|---|---|---|---|---|"]
        for s in result.red:
            lines.append(f"| {s.hostname or s.fingerprint} | {s.case_id} | {s.metric} | {s.since_date} ({s.since_run}) "
                         f"| {s.ratio - 1:+.1%} | {s.against} |")
    recent = sorted(result.history.changes, key=lambda c: c.date, reverse=True)[:30]
    if recent:
        lines += ["", "## Latest changes in the history", "",
                  "| date | machine | case | metric | change | kind | accepted |", "|---|---|---|---|---|---|---|"]
        for c in recent:
            lines.append(f"| {c.date} | {c.fingerprint} | {c.case_id} | {c.metric} | {c.ratio - 1:+.1%} | {c.kind} | "
                         f"{'yes: ' + c.note if c.accepted else 'no'} |")
    return "\n".join(lines) + "\n"


def to_json(result: NightlyResult) -> str:
    return json.dumps({"verdict": result.summary, "exit_code": result.exit_code, "root": result.root,
                       "groups": [asdict(g) for g in result.groups], "red": [asdict(s) for s in result.red],
                       "warnings": result.history.warnings, "contended": contended_records(result.history.contended),
                       "changes": [asdict(c) for c in result.history.changes]}, indent=2, default=str)


def to_junit(result: NightlyResult) -> str:
    """One suite per machine and suite, one test per case and metric run tonight: red fails;
    contended and missing cases are skipped with the reason."""
    red = {(s.fingerprint, s.suite, s.case_id, s.metric): s for s in result.red}
    suites = []
    for (fp, suite), g in sorted({(g.fingerprint, g.suite): g for g in result.groups}.items()):
        classname, cases = f"{g.hostname}.{suite}", []
        for s in result.history.states:
            if (s.fingerprint, s.suite) != (fp, suite) or s.latest_run != g.tonight:
                continue
            failure = (f"{s.ratio - 1:+.1%} vs {s.against} level since {s.since_date}"
                       if (fp, suite, s.case_id, s.metric) in red else None)
            cases.append(TestCase(classname, f"{s.case_id}.{s.metric}", failure=failure, failure_type="red"))
        skipped = f"contended tonight: not judged ({g.contention or 'no reason recorded'})"
        cases += [TestCase(classname, case, skipped=skipped) for case in g.contended]
        cases += [TestCase(classname, case, skipped="missing tonight") for case in g.missing]
        if g.unfinished:
            cases.append(TestCase(classname, "run", failure=f"tonight's run {g.tonight} is {g.unfinished}",
                                  failure_type="unfinished"))
        suites.append((f"{g.hostname or fp} {suite}", cases))
    return junit.to_junit("amp_bench nightly", suites)


def write_outputs(result: NightlyResult, stem: Path) -> dict[str, Path]:
    from amp_bench.store.results import write_reports
    return write_reports(stem, {"md": (".md", to_markdown(result)), "json": (".json", to_json(result)),
                                "junit": (".junit.xml", to_junit(result))})
