"""compare's outputs: its markdown table, JSON verdict and JUnit file; re-exported by amp_bench.analysis.compare."""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np

from amp_bench.analysis import junit
from amp_bench.analysis.junit import TestCase


def _fmt(value, spec=".3f") -> str:
    return "-" if value is None or (isinstance(value, float) and not np.isfinite(value)) else format(value, spec)


def to_markdown(comparison) -> str:
    lines = [f"# amp_bench compare: {comparison.summary}", "", f"{comparison.decision} (exit {comparison.exit_code})",
             "", f"baseline: {', '.join(comparison.baseline)}  ", f"candidate: {', '.join(comparison.candidate)}  ",
             "thresholds: " + ", ".join(f"{k} {v}" for k, v in comparison.thresholds.items()), "",
             "| case | metric | baseline | candidate | ratio | 95% CI | p (MWU) | verdict |",
             "|---|---|---|---|---|---|---|---|"]
    for r in comparison.results:
        verdict = f"**{r.verdict}**" if comparison.finding(r) else r.verdict
        lines.append(f"| {r.case_id} | {r.metric} | {_fmt(r.baseline, '.4g')} | {_fmt(r.candidate, '.4g')} | "
                     f"{_fmt(r.ratio)} | {_fmt(r.ci_low)}-{_fmt(r.ci_high)} | {_fmt(r.p_value, '.2g')} | {verdict} |")
    lines += [""] + [f"- {note}" for note in comparison.notes + comparison.unmatched]
    return "\n".join(lines) + "\n"


def to_json(comparison) -> str:
    return json.dumps({"verdict": comparison.summary, "exit_code": comparison.exit_code,
                       "decision": comparison.decision, "baseline": comparison.baseline,
                       "candidate": comparison.candidate, "thresholds": comparison.thresholds,
                       "notes": comparison.notes, "unmatched": comparison.unmatched,
                       "results": [asdict(r) for r in comparison.results]}, indent=2, default=float)


def to_junit(comparison) -> str:
    """One test per case and metric: a finding fails; no verdict or a neutral one is skipped."""
    cases = []
    for r in comparison.results:
        text = r.detail if r.metric == "status" else \
            f"ratio {_fmt(r.ratio)} (95% CI {_fmt(r.ci_low)}-{_fmt(r.ci_high)}); {r.detail}"
        finding = comparison.finding(r)
        skipped = None if finding or comparison.judged(r) else f"{r.verdict}: {text}"
        cases.append(TestCase("amp_bench.analysis.compare", f"{r.case_id}.{r.metric}",
                              failure=text if finding else None, failure_type=r.verdict, skipped=skipped))
    return junit.to_junit("amp_bench compare", [("amp_bench compare", cases)])


def write_outputs(comparison, stem: Path) -> dict[str, Path]:
    from amp_bench.store.results import write_reports
    return write_reports(stem, {"md": (".md", to_markdown(comparison)), "json": (".json", to_json(comparison)),
                                "junit": (".junit.xml", to_junit(comparison))})
