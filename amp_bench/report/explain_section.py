"""The report's "Where the time goes" section: per case, the profiled step's time per category for
every mode (stacked bars), the waterfall from the fp32 step to each mode's, the sentence that says
why the speedup is what it is, and the misaligned GEMM/conv layers. The numbers are
explain/decompose.py's; this module only lays them out (plotly imported when a figure is drawn)."""
from __future__ import annotations

import html

import pandas as pd

from amp_bench.analysis.explain.categories import CATEGORIES, HOST, LABELS
from amp_bench.analysis.explain.decompose import category_table, explain_results
from amp_bench.analysis.explain.sentence import sentence
from amp_bench.identity import case_labels

SECTION = ("explain", "Where the time goes")
HOW_TO = ("Each case ran 3-8 extra training steps under torch.profiler after its timed window (as many as the "
          "profiler's cost allows); the bars split the median profiled step into categories (self time of CPU ops; on "
          "a GPU kernel time, overlapping streams shared, plus the time the GPU sat idle). Speedups in the sentences "
          "are the measured ones (timed windows), never the profiled steps'. A category is called faster or slower "
          "only beyond its spread over the profiled steps of every repeat. The ceiling is the step this hardware "
          "allows the mode: GEMM, conv and attention at the peak ratio of the mode's unit to fp32's (Tensor Cores; "
          "AMX / AVX512-BF16 on CPUs), memory-bound work at half the bytes, casts gone, the optimizer, communication "
          "and host time unchanged (docs/explain.md).")
ABSENT = ("These results carry no per-category breakdown: run with `explain: true` in the suite (or `run --explain`), "
          "or `python -m amp_bench explain SUITE`, to profile one extra step per case.")
COLORS = {"gemm": "#636efa", "conv": "#19d3f3", "attention": "#ab63fa", "elementwise": "#ffa15a", "norm": "#fecb52",
          "reduction": "#ff6692", "cast": "#ef553b", "layout": "#b6e880", "optimizer": "#00cc96",
          "communication": "#ff97ff", "other": "#999999", HOST: "#dddddd"}


def has_explain(results: pd.DataFrame) -> bool:
    return "explain_status" in results and results["explain_status"].isin(["ok", "distorted"]).any()


def stacked_bars(results: pd.DataFrame):
    """ms per step by category, one bar per mode, one panel per case; None without breakdowns."""
    table = category_table(results)
    if table.empty:
        return None
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots
    cases = list(dict.fromkeys(table["case"]))
    fig = make_subplots(rows=len(cases), cols=1, subplot_titles=cases, vertical_spacing=0.12 / max(len(cases), 1))
    for i, case in enumerate(cases, start=1):
        rows = table[table["case"] == case]
        for category in list(CATEGORIES) + [HOST]:
            part = rows[rows["category"] == category]
            if part["ms_per_step"].fillna(0).sum() <= 0:
                continue
            fig.add_trace(go.Bar(x=part["precision"], y=part["ms_per_step"], name=LABELS[category],
                                 marker_color=COLORS[category], legendgroup=category, showlegend=i == 1,
                                 customdata=part["share_of_step"],
                                 hovertemplate="%{x}: %{y:.1f} ms (%{customdata:.0%})"), row=i, col=1)
        fig.update_yaxes(title_text="ms per step", row=i, col=1)
    fig.update_layout(barmode="stack", template="plotly_white", height=120 + 300 * len(cases),
                      title="Where the profiled step's time goes, per precision mode")
    return fig


def waterfall(results: pd.DataFrame):
    """From the baseline's (fp32's) step to each mode's step, one bar per category that moved; None without pairs."""
    pairs = explain_results(results)
    if not pairs:
        return None
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots
    titles = [f"{label}: {d.baseline} -> {d.mode}" + ("" if d.explains_measurement else
                                                      " (the profile does not explain the measurement)")
              for label, d in pairs]
    fig = make_subplots(rows=len(pairs), cols=1, subplot_titles=titles, vertical_spacing=0.12 / len(pairs))
    for i, (_, d) in enumerate(pairs, start=1):
        steps = d.waterfall()
        measures = ["absolute"] + ["relative"] * (len(steps) - 2) + ["total"]
        fig.add_trace(go.Waterfall(x=[s[0] for s in steps], y=[s[1] if m != "total" else 0 for s, m in
                                                                  zip(steps, measures, strict=True)],
                                   measure=measures, showlegend=False, decreasing={"marker": {"color": "#00cc96"}},
                                   increasing={"marker": {"color": "#ef553b"}},
                                   totals={"marker": {"color": "#636efa"}}), row=i, col=1)
        fig.update_yaxes(title_text="ms per step", row=i, col=1)
    fig.update_layout(template="plotly_white", height=120 + 320 * len(pairs),
                      title="Time saved (green) and added (red) per category, fp32 step to the mode's step")
    return fig


def figures(results: pd.DataFrame) -> list[tuple[str, str, object]]:
    """(section id, title, figure or None), as report/render.build_figures lists them."""
    if not has_explain(results):
        return [("explain", SECTION[1], None)]
    return [("explain", SECTION[1], stacked_bars(results)),
            ("explain-waterfall", "Where the time went: fp32 to each mode", waterfall(results))]


def alignment_rows(results: pd.DataFrame) -> pd.DataFrame:
    """Per case and mode, the misaligned layers and their FLOP share (from the explain_* columns). The
    case names its machine when the results come from several, and its compile mode when compiled,
    so two machines' (or eager and compiled) layers are never folded into one row."""
    if "explain_misaligned_layers" not in results:
        return pd.DataFrame()
    frame = results[results["explain_status"].isin(["ok", "distorted"])].copy()
    case = case_labels(frame)  # every axis (size, layout, processes, compile mode), as every table names a case
    if "device_name" in frame and frame["device_name"].nunique() > 1:
        case = case + " on " + frame["device_name"].astype(str)
    frame = frame.assign(case=case)
    return frame.groupby(["case", "precision"], sort=False).agg(
        misaligned_flop_share=("explain_misaligned_flop_share", "median"),
        misaligned_layers=("explain_misaligned_layers", "first"),
        device=("device", "first") if "device" in frame else ("precision", "first")).reset_index()


def layer_table(data) -> pd.DataFrame:
    """Every GEMM/conv layer of every profiled step with its alignment and FLOP share (the report's
    .explain_layers.csv): the whole list behind the misaligned ones the section shows."""
    from amp_bench.analysis.explain.judge import layer_rows
    if "explain_trace" not in data.results:
        return pd.DataFrame()
    return pd.DataFrame(layer_rows(data.results, data.run_dirs))


def _alignment_display(align: pd.DataFrame) -> pd.DataFrame:
    """The alignment rows as a reader sees them: the share in percent, plain column names."""
    shown = align.drop(columns=["device"], errors="ignore").copy()
    shown["misaligned_flop_share"] = shown["misaligned_flop_share"].map(lambda v: "-" if pd.isna(v) else f"{v:.1%}")
    shown["misaligned_layers"] = shown["misaligned_layers"].map(
        lambda v: "none" if pd.isna(v) or not str(v).strip() else str(v))
    return shown.rename(columns={"misaligned_flop_share": "share of the step's FLOPs",
                                 "misaligned_layers": "misaligned layers (module, shape, FLOP share)"})


def _notes(results: pd.DataFrame) -> list[str]:
    if "explain_status" not in results:
        return []
    bad = results[results["explain_status"].isin(["unavailable", "distorted"])]
    return [f"{row.get('case_id', row.get('model_label', ''))}: {row['explain_status']}: "
            f"{row.get('explain_reason', '')}"
            for _, row in bad.drop_duplicates(["case_id"] if "case_id" in bad else None).iterrows()]


def advice_display(results: pd.DataFrame, run_dirs) -> pd.DataFrame:
    """The run's advice (analysis/advice) as the report shows it: each case's items, ranked, with the predicted
    step and speedup and their intervals (rounded), how it was priced and the rule's source."""
    from amp_bench.analysis.advice.for_run import advice_table
    table = advice_table(results, run_dirs)
    if table.empty:
        return table
    table["predicted step ms"] = [f"{p:.4g} ({lo:.4g}-{hi:.4g})" for p, lo, hi in
                                  zip(table["predicted ms"], table["low ms"], table["high ms"], strict=True)]
    table["speedup"] = [f"{s:.2f}x ({step / hi:.2f}-{step / lo:.2f}x)" for s, step, lo, hi in
                        zip(table["speedup"], table["step ms"], table["low ms"], table["high ms"], strict=True)]
    return table[["case", "rule", "change", "evidence", "predicted step ms", "speedup", "how", "source"]]


ADVICE_NOTE = ("Advice, ranked by predicted gain (docs/advice.md): what to change, the evidence, the step predicted "
               "after it with its interval, how it was priced. `python -m amp_bench run --try RULE RUN_DIR` measures "
               "an item beside its case, in pairs.")


def section_html(results: pd.DataFrame, html_table, run_dirs=()) -> str:
    """The text under the section's heading: how to read it, the sentences, the advice, the alignment list, notes."""
    if not has_explain(results):
        return ""  # render.ABSENT says how to turn it on
    parts = [f"<p class='note'>{html.escape(HOW_TO)}</p>"]
    said = [f"{label}: {sentence(d)}." for label, d in explain_results(results)]
    if said:
        parts.append("<div class='headline'>" + "".join(f"<p>{html.escape(s)}</p>" for s in said) + "</div>")
    advice = advice_display(results, run_dirs)
    if not advice.empty:
        parts += [f"<p class='note'>{html.escape(ADVICE_NOTE)}</p>", html_table(advice)]
    align = alignment_rows(results)
    if not align.empty:
        cpu = "device" in align and (align["device"].astype(str) == "cpu").any()
        parts.append("<p class='note'>Tensor Core alignment: GEMM and convolution layers whose dimensions are not "
                     "multiples of 8 (16 for fp8), largest FLOP share first" +
                     (" (measured on a CPU: alignment matters on Tensor Core GPUs)" if cpu else "") + ".</p>")
        parts.append(html_table(_alignment_display(align)))
    notes = _notes(results)
    if notes:
        parts.append("<p class='note'>" + "<br>".join(html.escape(n) for n in notes) + "</p>")
    return "\n".join(parts)


def markdown(results: pd.DataFrame, markdown_table, run_dirs=()) -> list[str]:
    if not has_explain(results):
        return []
    lines = ["## Where the time goes", "", HOW_TO, ""]
    lines += [f"- {label}: {sentence(d)}." for label, d in explain_results(results)] + [""]
    advice = advice_display(results, run_dirs)
    if not advice.empty:
        lines += [ADVICE_NOTE, "", markdown_table(advice), ""]
    table = category_table(results)
    if not table.empty:
        wide = table.pivot_table(index=["case", "precision"], columns="category", values="ms_per_step",
                                 sort=False).reset_index()
        lines += ["ms per step by category:", "", markdown_table(wide.round(2)), ""]
    align = alignment_rows(results)
    if not align.empty:
        lines += ["Misaligned GEMM/conv layers (not multiples of 8; 16 for fp8):", "",
                  markdown_table(_alignment_display(align)), ""]
    return lines + [f"- {n}" for n in _notes(results)] + ([""] if _notes(results) else [])
