"""The report's torch.compile section: a precision x compile-mode matrix of speedups (over fp32
eager and over the same precision eager), compile time beside it, break-even steps, graph breaks and
recompiles. The numbers are summary.py's (_versus_eager); this module only lays them out."""
from __future__ import annotations

import pandas as pd

from amp_bench import identity, modes
from amp_bench.identity import EAGER
from amp_bench.report.data import machine_label, precision_sort_key

REF = modes.reference()  # the registry's baseline names the first speedup column
COLUMNS = {
    f"speedup_vs_{REF}_eager": f"speedup vs {REF} eager", "speedup_vs_eager": "speedup vs same precision eager",
    "step_time_ms": "ms/step", "compile_time_s": "compile time (s)", "compile_first_step_ms": "first step (ms)",
    "break_even_steps": "break-even steps", "graph_breaks": "graph breaks", "recompiles": "recompiles",
    "recompiles_in_window": "recompiles in window",
}


def has_compile(summary: pd.DataFrame) -> bool:
    return "compile_mode" in summary and (summary["compile_mode"] != EAGER).any()  # keyed: eager where absent


def _cases(summary: pd.DataFrame) -> pd.DataFrame:
    """The summary with its machine and `case`: every axis but the compile mode (identity's label), the
    machine too where there are several, so no two cases are pooled."""
    frame = summary.copy()
    frame["machine"] = machine_label(frame)
    frame["case"] = identity.case_labels(frame, without=("compile_mode",))
    if frame["machine"].nunique() > 1:
        frame["case"] = frame["case"] + " on " + frame["machine"]
    return frame


def compile_table(summary: pd.DataFrame) -> pd.DataFrame:
    """One row per case (every axis but the compile mode), precision and compile mode, eager first;
    failed cases keep their status (compile_error among them) and no figures."""
    if not has_compile(summary):
        return pd.DataFrame()
    frame = _cases(summary)
    frame["_eager_last"] = frame["compile_mode"] != EAGER
    frame["_order"] = precision_sort_key(frame["precision"])
    axes = [a for a in identity.case_axes() if a != "compile_mode"]
    frame = frame.sort_values(["machine", *axes, "_order", "_eager_last", "compile_mode"], kind="stable")
    keep = ["machine", "case", "precision", "compile_mode", "status"] + [c for c in COLUMNS if c in frame]
    table = frame.reindex(columns=keep).rename(columns=COLUMNS)
    failed = frame["status"] != "ok"
    table.loc[failed.values, [COLUMNS[c] for c in COLUMNS if c in frame and c not in ("graph_breaks",)]] = None
    return table.reset_index(drop=True)


def speedup_matrix(summary: pd.DataFrame, column: str = f"speedup_vs_{REF}_eager") -> pd.DataFrame:
    """precision (rows) x compile mode (columns) of one speedup, per case (_cases: never two pooled)."""
    if not has_compile(summary):
        return pd.DataFrame()
    matrix = _cases(summary).pivot_table(index=["case", "precision"], columns="compile_mode", values=column,
                                         aggfunc="median")
    columns = [EAGER] + sorted(c for c in matrix.columns if c != EAGER)
    return matrix.reindex(columns=[c for c in columns if c in matrix.columns])


def heatmap(summary: pd.DataFrame):
    """A plotly heatmap of the matrix over the reference mode's eager step (None without compiled cases); plotly at call
    time."""
    matrix = speedup_matrix(summary)
    if matrix.empty or matrix.notna().sum().sum() == 0:
        return None
    import plotly.graph_objects as go
    labels = [" ".join(map(str, index)) for index in matrix.index]
    fig = go.Figure(go.Heatmap(z=matrix.values, x=list(matrix.columns), y=labels, colorscale="RdYlGn", zmid=1.0,
                               text=[[("-" if v != v else f"{v:.2f}x") for v in row] for row in matrix.values],
                               texttemplate="%{text}", colorbar={"title": f"vs {REF} eager"}))
    fig.update_layout(template="plotly_white", title=f"Speedup over {REF} eager: precision x compile mode",
                      height=200 + 30 * len(labels))
    return fig


def markdown(summary: pd.DataFrame, markdown_table) -> list[str]:
    table = compile_table(summary)
    if table.empty:
        return []
    lines = ["## torch.compile: precision x compile mode", "",
             "Speedups are ratios of median step times in the same run; compile time is the wall time of the "
             "warmup steps that compiled; break-even steps = compile time / (eager step - compiled step).", "",
             markdown_table(table), ""]
    for column in (f"speedup_vs_{REF}_eager", "speedup_vs_eager"):
        matrix = speedup_matrix(summary, column)
        if not matrix.empty:
            lines += [f"{COLUMNS[column]}:", "", markdown_table(matrix.reset_index()), ""]
    return lines


def html(summary: pd.DataFrame, html_table) -> str:
    table = compile_table(summary)
    if table.empty:
        return ""
    return ("<p class='note'>Compile time is the wall time of the warmup steps that compiled; break-even steps = "
            "compile time / (eager step - compiled step): after that many steps compiling has paid for itself.</p>"
            + html_table(table))
