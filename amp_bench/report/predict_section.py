"""The report's "On GPUs (predicted, nothing measured here)" section: each case's predicted step time,
throughput, speedup over fp32 and peak memory on GPUs, with intervals, and 'unsupported' with the reason.
A run made without a GPU brings its own (predicted.csv: its suite's GPU cases, recorded on fake tensors
when it ran: studies/gpu_predictions.py); a GPU run whose suite has a `predict:` block is scaled from its
profiled kernels here. The numbers are analysis/predict/'s; this module lays them out (plotly imported when
the figure is drawn). A run that cannot be predicted says why in one line."""
from __future__ import annotations

import html

import pandas as pd

from amp_bench.errors import UserError

SECTION = ("predict", "On GPUs (predicted, nothing measured here)")
ABSENT = ("Nothing predicted: a run on a machine without a GPU predicts its suite's GPU cases when it ends; a GPU "
          "run predicts other GPUs with `predict: {targets: [h100-sxm, a100-80gb, l4, v100-sxm2]}` in the suite "
          "(explain on), or `python -m amp_bench predict SUITE|RUN_DIR --target ...`.")
HOW_TO = ("Predictions, not measurements: they never enter compare, nightly or an export. From a GPU run, every "
          "profiled kernel keeps the efficiency it reached and takes the target's peak for its math unit (FP32, "
          "TF32, 16-bit or FP8 tensor cores) or its memory bandwidth, whichever bounds it; tiny kernels and host "
          "time stay as measured. From a run without a GPU, the suite's GPU cases are recorded on fake tensors "
          "and every op is priced by a model fitted on published AMP pairs and this project's H200 reading; its "
          "peak memory is the tensors alive at the step's peak. A speedup is over the target's own predicted fp32 "
          "step (docs/predict.md).")
_CACHE: dict[tuple, tuple] = {}


def predictions(data) -> tuple[pd.DataFrame, list[str]]:
    """(every prediction of the runs that asked for them, one line per run that could not be predicted)."""
    from amp_bench.analysis.predict.model import predict_run
    from amp_bench.analysis.predict.settings import chosen, notes, recorded_line, suite_settings
    from amp_bench.store.results import read_table
    key = tuple((str(d), _mtime(d)) for d in data.run_dirs)
    if key in _CACHE:
        return _CACHE[key]
    frames, lines = [], []
    for run_dir in data.run_dirs:
        if (run_dir / "predicted.csv").is_file():  # a run without a GPU: what it predicted when it ended
            frames.append(read_table([run_dir], "predicted").assign(run=run_dir.name))
            lines.append(recorded_line())
            continue
        try:
            if not suite_settings(run_dir).get("targets"):
                continue
            targets, fp32_as = chosen(run_dir)
            result = predict_run(run_dir, targets, fp32_as)
        except UserError as exc:
            lines.append(f"{run_dir}: not predicted: {exc.lines[0]}")
            continue
        frames.append(result.table.assign(run=run_dir.name))
        lines += notes(result, targets, fp32_as)
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
        memory, saved = row.get("peak_memory_bytes"), row.get("memory_saving")
        rows.append({"case": row["case"], "GPU": row["target_label"], "mode": row["precision"],
                     "step ms": _cell(row, "step_ms", 1) if ok else "-",
                     "samples/s": _cell(row, "throughput", 0) if ok else "-",
                     "speedup vs fp32": _cell(row, "speedup", 2, "x") if ok else "-",
                     "peak memory": f"{memory / 2**30:.1f} GiB" if ok and memory == memory and memory else "-",
                     "saved": f"{saved:.0%}" if ok and saved == saved and saved is not None else "-",
                     "note": "" if ok else f"{row['status']}: {row['reason']}", "source": row["source"]})
    return pd.DataFrame(rows)


ADVICE_NOTE = ("Changes a GPU rewards that these GPU cases do not make yet, each recorded on fake tensors as is and "
               "changed and priced on each GPU: the step's predicted gain with its interval (docs/advice.md). "
               "Predicted, nothing measured.")


def advice_table(data) -> pd.DataFrame:
    """One row per GPU case, change and target (predicted_advice.csv, studies/gpu_advice.py) as a reader sees it."""
    from amp_bench.analysis.advice.targets import said
    from amp_bench.store.results import read_table
    table = read_table(data.run_dirs, "predicted_advice")
    return pd.DataFrame([{"case": row["case"], "mode": row["precision"], "change": row["change"],
                          "on the GPU": said(row)} for row in table.to_dict("records")])


def section_html(data, html_table) -> str:
    table, lines = predictions(data)
    parts = [f"<p class='note'>{html.escape(HOW_TO)}</p>"]
    if not table.empty:
        parts.append(html_table(reading_table(table)))
    parts += [f"<p class='note'>{html.escape(line)}</p>" for line in lines]
    advice = advice_table(data)
    if not advice.empty:
        parts += [f"<p class='note'>{html.escape(ADVICE_NOTE)}</p>", html_table(advice)]
    return "\n".join(parts)


def markdown(data, markdown_table) -> list[str]:
    table, lines = predictions(data)
    advice = advice_table(data)
    if table.empty and not lines and advice.empty:
        return []
    out = [f"## {SECTION[1]}", "", HOW_TO, ""]
    if not table.empty:
        out += [markdown_table(reading_table(table)), ""]
    if not advice.empty:
        out += [ADVICE_NOTE, "", markdown_table(advice), ""]
    return out + [f"- {line}" for line in lines] + [""]
