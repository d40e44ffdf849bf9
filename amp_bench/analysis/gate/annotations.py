"""Annotations: accepted changes (a new driver, an intended trade-off), written as people write them.

annotations.yaml at the root of a results tree is a list of entries:

    - run: "20261113T*-node-a-*"   # a run id or a glob; or from: 2026-11-13 (to: ...) for a date range
      machine: node-a              # a fingerprint or a host name (glob); default any
      suite: resnet50              # glob; default any
      case: "resnet50-*"           # glob; default any
      metric: step_time_ms         # default any
      window: 3                    # days after the date within which a detection is covered (default 3)
      name: driver-590             # optional: how warnings name it
      note: new driver, accepted

An entry covers a change (or the current red state) of a matching series whose start, or the range
of nights it may have begun in, falls between the entry's date and `window` days after it. The old
form ({run: EXACT-ID, case, fingerprint, metric, note}) keeps working. An entry that covers nothing
is reported by name, so a mistyped run id is not ignored silently.
"""
from __future__ import annotations

import datetime as dt
import fnmatch
from pathlib import Path

import pandas as pd
import yaml

from amp_bench.errors import UserError

METRICS = ("step_time_ms", "throughput", "peak_mem_bytes")
KEYS = ("run", "from", "to", "machine", "fingerprint", "suite", "case", "metric", "window", "name", "note")
DEFAULT_WINDOW_DAYS = 3


def _date(value, where: str) -> pd.Timestamp:
    try:
        stamp = pd.Timestamp(value.isoformat() if isinstance(value, (dt.date, dt.datetime)) else str(value))
    except (ValueError, TypeError):
        raise UserError(f"{where}: expected a date like 2026-11-13, got {value!r}") from None
    return stamp.tz_localize("UTC") if stamp.tzinfo is None else stamp.tz_convert("UTC")


def load(path: Path | None) -> list[dict]:
    if path is None or not Path(path).exists():
        return []
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or []
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark else ""
        raise UserError(f"{path}{where}: invalid YAML: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(data, list):
        raise UserError(f"{path}: expected a list of annotations, got {type(data).__name__}")
    problems, entries = [], []
    for i, entry in enumerate(data):
        where = f"{path}: [{i}]"
        if not isinstance(entry, dict):
            problems.append(f"{where}: expected a mapping with run (or from) and note, got {entry!r}")
            continue
        problems += [f"{where}.{key}: unknown key (expected one of: {', '.join(KEYS)})" for key in entry
                     if key not in KEYS]
        if not entry.get("run") and not entry.get("from"):
            problems.append(f"{where}.run: missing (the run id or glob where the accepted change starts, "
                            "or from: a date)")
        if entry.get("metric") not in (None, *METRICS):
            problems.append(f"{where}.metric: expected one of {', '.join(METRICS)}, got {entry['metric']!r}")
        window = entry.get("window", DEFAULT_WINDOW_DAYS)
        if not isinstance(window, (int, float)) or isinstance(window, bool) or window < 0:
            problems.append(f"{where}.window: expected a number of days >= 0, got {window!r}")
        try:
            start = _date(entry["from"], f"{where}.from") if entry.get("from") else None
            end = _date(entry["to"], f"{where}.to") if entry.get("to") else start
        except UserError as exc:
            problems.extend(exc.lines)
            continue
        name = entry.get("name") or (f"{entry['note']!s}" if entry.get("note") else f"#{i}")
        entries.append({**entry, "_index": i, "_name": f"[{i}] {name!r}", "_from": start, "_to": end,
                        "_window": pd.Timedelta(days=float(window) if isinstance(window, (int, float)) else 0)})
    if problems:
        raise UserError(problems)
    return entries


def resolve(entries: list[dict], run_dates: pd.Series) -> list[dict]:
    """Give run-glob entries their date range from the runs they name (run_dates: run id -> time)."""
    for entry in entries:
        if entry.get("run") and entry["_from"] is None:
            pattern = str(entry["run"])
            hits = run_dates[[fnmatch.fnmatchcase(r, pattern) for r in run_dates.index]]
            entry["_runs"] = set(hits.index)
            if not hits.empty:
                entry["_from"], entry["_to"] = hits.min(), hits.max()
        entry.setdefault("_runs", set())
        entry.setdefault("_hits", 0)
    return entries


def _glob(pattern, *values) -> bool:
    return pattern in (None, "*") or any(fnmatch.fnmatchcase(str(v), str(pattern)) for v in values if v is not None)


def covering(entries: list[dict], *, case_id: str, fingerprint: str, hostname: str | None, suite: str | None,
             metric: str, start_run: str, earliest: pd.Timestamp, latest: pd.Timestamp) -> dict | None:
    """The first entry that covers a detection dated earliest..latest (its first run start_run)."""
    for entry in entries:
        if not (_glob(entry.get("case"), case_id) and _glob(entry.get("suite"), suite)
                and _glob(entry.get("machine"), fingerprint, hostname)
                and _glob(entry.get("fingerprint"), fingerprint)
                and entry.get("metric") in (None, metric)):
            continue
        if start_run in entry["_runs"] or (entry["_from"] is not None and earliest <= entry["_to"] + entry["_window"]
                                           and latest >= entry["_from"]):
            entry["_hits"] += 1
            return entry
    return None


def unmatched(entries: list[dict], path: Path | None) -> list[str]:
    """One warning per entry that covered nothing, naming it."""
    out = []
    for entry in entries:
        if entry["_hits"]:
            continue
        why = (f"run {entry['run']!r} matches no run" if entry.get("run") and not entry["_runs"] and
               entry["_from"] is None else "covers no change in any matching series")
        out.append(f"{path or 'annotations'}: annotation {entry['_name']} matched nothing: {why}")
    return out
