"""The report's "What other GPUs would give" section: for the runs whose suite has a `predict:` block,
each case's predicted step time, throughput and speedup over fp32 on the named GPUs, with intervals,
and 'unsupported' with the reason. The numbers are analysis/predict/'s; this module lays them out
(plotly imported when the figure is drawn). A run that cannot be predicted says why in one line."""
from __future__ import annotations

import html

import pandas as pd

from amp_bench.errors import UserError

SECTION = ("predict", "What other GPUs would give")
ABSENT = ("No run here asked for predictions: add `predict: {targets: [h100-sxm, a100-80gb, l4, v100-sxm2]}` to the "
          "suite (explain on), or run `python -m amp_bench predict RUN_DIR --target ...`.")
HOW_TO = ("Each profiled step is scaled to the target GPU: from a GPU run, every kernel keeps the efficiency it "
          "reached and takes the target's peak for its math unit (FP32, TF32, 16-bit or FP8 tensor cores) or its "
          "memory bandwidth, whichever bounds it; tiny kernels and host time stay as measured. From a CPU run, the "
          "ops are priced at the target's derated roofline: a much wider interval. Intervals are the spread of the "
          "same rules' errors on public per-op measurements (docs/predict.md); a speedup is over the target's own "
          "predicted fp32 step.")
_CACHE: dict[tuple, tuple] = {}


def predictions(data) -> tuple[pd.DataFrame, list[str]]:
    """(every prediction of the runs that asked for them, one line per run that could not be predicted)."""
    from amp_bench.analysis.predict.model import predict_run
    from amp_bench.analysis.predict.settings import notes, suite_settings
    key = tuple((str(d), _mtime(d)) for d in data.run_dirs)
    if key in _CACHE:
        return _CACHE[key]
    frames, lines = [], []
    for run_dir in data.run_dirs:
        try:
            settings = suite_settings(run_dir)
            if not settings.get("targets"):
                continue
            fp32_as = None if settings.get("fp32_as") in (None, "mode") else settings["fp32_as"]
            result = predict_run(run_dir, settings["targets"], fp32_as)
        except UserError as exc:
            lines.append(f"{run_dir}: not predicted: {exc.lines[0]}")
            continue
        frames.append(result.table.assign(run=run_dir.name))
        lines += notes(result, settings["targets"], fp32_as)
    _CACHE[key] = (pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(), list(dict.fromkeys(lines)))
    return _CACHE[key]


def _mtime(run_dir) -> int:
    """results.csv's modification time: a run that gained rows is predicted again."""
    try:
        return (run_dir / "results.csv").stat().st_mtime_ns
    except OSError:
        return 0


def figure(table: pd.DataFrame):
    """Predicted speedup over fp32 per target GPU, one bar group per mode, the interval as error bars."""
    ok = table[table["speedup"].notna()] if not table.empty else table
    if ok.empty:
        return None
    import plotly.graph_objects as go
    fig = go.Figure()
    for (case, precision), rows in ok.groupby(["case", "precision"], sort=False):
        fig.add_trace(go.Bar(x=rows["target_label"], y=rows["speedup"], name=f"{case} {precision}",
                             error_y={"type": "data", "symmetric": False,
                                      "array": rows["speedup_high"] - rows["speedup"],
                                      "arrayminus": rows["speedup"] - rows["speedup_low"]}))
    fig.update_layout(barmode="group", template="plotly_white", yaxis_title="predicted speedup over fp32",
                      title="Predicted speedup on other GPUs (bars: point; whiskers: interval)")
    return fig


def figures(data) -> list[tuple[str, str, object]]:
    return [(SECTION[0], SECTION[1], figure(predictions(data)[0]))]


def _cell(row, column: str, digits: int, suffix: str = "") -> str:
    value = row.get(column)
    if value is None or value != value:
        return "-"
    return f"{value:.{digits}f}{suffix} ({row[column + '_low']:.{digits}f}-{row[column + '_high']:.{digits}f})"


def reading_table(table: pd.DataFrame) -> pd.DataFrame:
    """One row per case, target and mode as a reader sees it."""
    rows = []
    for _, row in table.iterrows():
        ok = row["status"] == "ok"
        rows.append({"case": row["case"], "GPU": row["target_label"], "mode": row["precision"],
                     "step ms": _cell(row, "step_ms", 1) if ok else "-",
                     "samples/s": _cell(row, "throughput", 0) if ok else "-",
                     "speedup vs fp32": _cell(row, "speedup", 2, "x") if ok else "-",
                     "note": "" if ok else f"{row['status']}: {row['reason']}", "source": row["source"]})
    return pd.DataFrame(rows)


def section_html(data, html_table) -> str:
    table, lines = predictions(data)
    parts = [f"<p class='note'>{html.escape(HOW_TO)}</p>"]
    if not table.empty:
        parts.append(html_table(reading_table(table)))
    parts += [f"<p class='note'>{html.escape(line)}</p>" for line in lines]
    return "\n".join(parts)


def markdown(data, markdown_table) -> list[str]:
    table, lines = predictions(data)
    if table.empty and not lines:
        return []
    out = [f"## {SECTION[1]}", "", HOW_TO, ""]
    if not table.empty:
        out += [markdown_table(reading_table(table)), ""]
    return out + [f"- {line}" for line in lines] + [""]
