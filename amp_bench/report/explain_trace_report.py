"""The report of `explain --trace A [--trace B]`: one markdown file and one self-contained HTML page
with the traces' categories, HTA-style totals, idle time, Tensor Core use and the sentence (the
figures are analysis/explain/any_trace.py's; this module lays them out)."""
from __future__ import annotations

import html
from pathlib import Path

import pandas as pd

from amp_bench.report.render import CSS, html_table, markdown_table

HOW_TO = ("Per trace: the median over its steps (amp_bench::step regions, else ProfilerSteps less the last one) of "
          "the time per category; on a GPU the categories split each step's busy time (overlapping streams shared). "
          "Idle is the time in a step when nothing runs on the device (the host row; on a CPU, no op running), "
          "and its share is of that step, here and in the sentence. The kinds follow Holistic Trace Analysis: "
          "busy time per kernel kind (computation, communication, memory) over the whole trace, merged over streams.")


def _sections(explanation) -> list[tuple[str, object]]:
    """(heading, a table or lines of text) in page order."""
    out = [("Traces", pd.DataFrame(explanation.summary_rows())),
           ("ms per step by category", pd.DataFrame(explanation.category_rows()))]
    if explanation.units():
        out.append(("Tensor Cores", explanation.units()))
    if explanation.differences:
        out.append(("Before comparing: how the two traces differ", [line for _, line in explanation.differences]))
    if explanation.sentences():
        out.append(("Why", explanation.sentences()))
    advice = advice_lines(explanation)
    if advice:
        out.append(("Advice (docs/advice.md)", advice))
    if explanation.notes:
        out.append(("Notes", explanation.notes))
    return out


def advice_lines(explanation) -> list[str]:
    """Each trace's advice items, ranked (from what a trace alone shows: no layer records, no oneDNN step),
    and what is by design; the trace's mode is --modes' where given."""
    from amp_bench.analysis.advice import advise, intrinsic
    from amp_bench.analysis.advice.evidence import from_profile
    modes = list(explanation.modes or []) if getattr(explanation, "modes", None) else []
    lines = []
    for n, (name, profile) in enumerate(zip(explanation.names, explanation.profiles, strict=True)):
        evidence = from_profile(profile, modes[n] if n < len(modes) else "")
        lines += [f"{name}: {i}. {item.line()}" for i, item in enumerate(advise(evidence), 1)]
        lines += [f"{name}: by design: {note}" for note in intrinsic(evidence)]
    return lines


def markdown(explanation) -> str:
    lines = [f"# Where the time goes: {' vs '.join(explanation.names)}", "", HOW_TO, ""]
    for heading, body in _sections(explanation):
        lines += [f"## {heading}", ""]
        lines += [markdown_table(body.round(3))] if isinstance(body, pd.DataFrame) else [f"- {t}" for t in body]
        lines.append("")
    return "\n".join(lines)


def page(explanation) -> str:
    title = html.escape(f"Where the time goes: {' vs '.join(explanation.names)}")
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title><style>{CSS}</style></head>"
             f"<body><h1>{title}</h1><p class='note'>{html.escape(HOW_TO)}</p>"]
    for heading, body in _sections(explanation):
        parts.append(f"<h2>{html.escape(heading)}</h2>")
        parts.append(html_table(body) if isinstance(body, pd.DataFrame) else
                     "".join(f"<p>{html.escape(t)}</p>" for t in body))
    return "".join(parts) + "</body></html>"


def write(explanation, reports_dir: Path) -> dict[str, Path]:
    """reports/explain-<A>[-vs-<B>]-<hash of their paths>.md and .html."""
    reports_dir.mkdir(parents=True, exist_ok=True)
    stem = explanation.report_stem()
    md, page_path = reports_dir / f"{stem}.md", reports_dir / f"{stem}.html"
    md.write_text(markdown(explanation), encoding="utf-8")
    page_path.write_text(page(explanation), encoding="utf-8")
    return {"md": md, "html": page_path}
