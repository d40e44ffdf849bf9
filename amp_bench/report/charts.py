"""Plotly figures for the report. Each function takes the plotting-free tables from data.py and
returns a figure, or None when the results hold nothing for that chart (the report says so)."""
from __future__ import annotations

import numpy as np
import pandas as pd

from amp_bench import identity, modes
from amp_bench.report.data import machine_label, precision_sort_key
from amp_bench.store.flags import is_true, text_column, true_rows

TEMPLATE = "plotly_white"


def _px():
    import plotly.express as px
    return px


def _x_label(frame: pd.DataFrame, without: tuple[str, ...] = ()) -> pd.Series:
    """A case without its model (the charts facet by model): the identity module's label."""
    return identity.case_labels(frame, model=False, without=without)  # keyed -1 sizes read as none


def _facets(frame: pd.DataFrame) -> dict:
    """Facet columns by model; rows by machine when several machines are merged."""
    facets = {"facet_col": "model_label",
              "category_orders": {"model_label": list(dict.fromkeys(frame["model_label"])), "precision": modes.order()}}
    if frame["machine"].nunique() > 1:
        # every machine gets its row, even one with nothing measured, so rows line up with
        # _mark_not_measured's numbering
        facets["facet_row"] = "machine"
        facets["category_orders"]["machine"] = list(dict.fromkeys(frame["machine"]))
    return facets


def _finish(fig, title: str, y_title: str, height_per_row: int = 360):
    rows = len(fig._grid_ref) if getattr(fig, "_grid_ref", None) else 1
    fig.update_layout(title=title, template=TEMPLATE, height=max(380, height_per_row * rows + 80),
                      legend_title_text="", margin=dict(t=80, r=20))
    fig.for_each_annotation(lambda a: a.update(text=a.text.split("=", 1)[-1]))
    fig.update_yaxes(title_text=y_title, col=1)
    return fig


def speedup_chart(summary: pd.DataFrame, base: str | None = None):
    """Paired speedup of each mode over the baseline, per model and batch size, error bars = its 95%
    interval (analysis/speedups: t on the per-repeat log ratios; a single pair: its windows' intervals).
    Cases that were not measured are drawn as labelled crosses on the parity line, never as zero."""
    base = base or modes.reference()
    frame = summary[summary["precision"] != base].copy()
    frame = frame[frame["precision"].isin(modes.amp_names() + tuple(b for b in modes.baseline_names()
                                                                    if base == modes.reference() and b != base))]
    if frame.empty or frame[f"speedup_vs_{base}"].notna().sum() == 0:
        return None
    frame["x"] = _x_label(frame)
    high = frame.get(f"speedup_vs_{base}_ci_high", frame[f"speedup_vs_{base}_max"])  # older summaries: the spread
    low = frame.get(f"speedup_vs_{base}_ci_low", frame[f"speedup_vs_{base}_min"])
    frame["err_plus"] = (high - frame[f"speedup_vs_{base}"]).clip(lower=0)
    frame["err_minus"] = (frame[f"speedup_vs_{base}"] - low).clip(lower=0)
    frame["repeats"] = frame[f"speedup_vs_{base}_pairs"].fillna(0).astype(int)
    frame = frame.sort_values(["batch_size", "channels_last"], kind="stable")
    measured = frame[frame[f"speedup_vs_{base}"].notna()].copy()
    # a figure that needs care says so on its bar: emulated dtype, or a machine shared in the window
    measured["caveat"] = [" · ".join(word for word, on in ((modes.EMULATED, e), ("contended", c)) if on)
                          for e, c in zip(true_rows(measured.get("emulated"), measured.index),
                                          true_rows(measured.get(f"contended_vs_{base}"), measured.index), strict=True)]
    fig = _px().bar(measured, x="x", y=f"speedup_vs_{base}", color="precision", barmode="group",
                    text="caveat" if (measured["caveat"] != "").any() else None,
                    error_y="err_plus", error_y_minus="err_minus", color_discrete_map=modes.colours(),
                    hover_data={"batch_size": True, "step_time_ms": ":.2f", "repeats": True, "status_counts": True,
                                "x": False, "err_plus": False, "err_minus": False},
                    labels={f"speedup_vs_{base}": f"speedup vs {base}", "x": "batch size"}, **_facets(frame))
    fig.update_xaxes(categoryorder="array", categoryarray=list(dict.fromkeys(frame["x"])))
    fig.add_hline(y=1.0, line_dash="dot", line_color="grey")
    _mark_not_measured(fig, frame, f"speedup_vs_{base}", base)
    return _finish(fig, f"Training-step speedup over {base} (paired per repeat; bars: 95% interval)",
                   f"speedup vs {base} (x)")


NOT_MEASURED_HEIGHT = 0.06  # the hatched cross-bar drawn around the parity line


def _mark_not_measured(fig, frame: pd.DataFrame, column: str, base: str) -> None:
    """A labelled cross on the parity line for every case without a ratio (its own failure, or its
    baseline's), in that mode's own slot of the bar group: a short hatched bar around 1.0 in the
    mode's offset group, so it never sits on a neighbouring mode's bar. Never drawn as zero. px lays
    facet rows out from the bottom, so row 1 is the last machine."""
    missing = frame[frame[column].isna()].copy()
    if missing.empty:
        return
    import plotly.graph_objects as go
    models = list(dict.fromkeys(frame["model_label"]))
    machines = list(dict.fromkeys(frame["machine"]))
    missing["why"] = np.where(missing["status"] == "ok", missing["precision"] + ": no " + base + " baseline",
                              missing["precision"] + ": " + missing["status"])
    missing["detail"] = np.where(missing["status"] == "ok", missing["precision"] + " was measured, but " + base +
                                 " was not (see 'Cases not measured')",
                                 missing["precision"] + " " + missing["status"] + ": " + text_column(missing, "reason"))
    for i, (_, row) in enumerate(missing.iterrows()):
        fig.add_trace(go.Bar(
            x=[row["x"]], y=[NOT_MEASURED_HEIGHT], base=[1.0 - NOT_MEASURED_HEIGHT / 2], offsetgroup=row["precision"],
            alignmentgroup="True", text=[row["why"]], textposition="outside", cliponaxis=False,
            marker=dict(color="rgba(0,0,0,0)", line=dict(color="black", width=1.5), pattern=dict(shape="x")),
            name="not measured", legendgroup="not measured", showlegend=i == 0, hovertext=[row["detail"]],
            hoverinfo="text"),
            row=len(machines) - machines.index(row["machine"]), col=models.index(row["model_label"]) + 1)


def memory_chart(summary: pd.DataFrame):
    """Memory saving against the reference mode (fp32) for every memory metric the results hold."""
    ref = modes.reference()
    metrics = [c for c in summary.columns if c.startswith("mem_saving_") and c.endswith(f"_vs_{ref}")
               and c not in (f"mem_saving_vs_{ref}", f"mem_saving_above_baseline_vs_{ref}")
               and summary[c].notna().any()]
    frame = summary[summary["precision"] != modes.reference()]
    if frame.empty or not metrics:
        return None
    long = frame.melt(id_vars=["model_label", "machine", "batch_size", "channels_last", "precision", "status"],
                      value_vars=metrics, var_name="metric", value_name="saving").dropna(subset=["saving"])
    if long.empty:
        return None
    long["metric"] = long["metric"].str[len("mem_saving_"):-len(f"_vs_{ref}")].str.replace("_", " ")
    long["x"] = _x_label(long) + " · " + long["metric"]
    long = long.sort_values(["batch_size", "metric"])
    fig = _px().bar(long, x="x", y="saving", color="precision", barmode="group", color_discrete_map=modes.colours(),
                    hover_data={"metric": True, "batch_size": True, "saving": ":.1%", "x": False},
                    labels={"x": "batch size · memory metric"}, **_facets(long))
    fig.update_yaxes(tickformat=".0%")
    fig.add_hrect(y0=0.40, y1=0.50, fillcolor="orange", opacity=0.12, line_width=0,
                  annotation_text="claimed 40-50%", annotation_position="top left")
    return _finish(fig, f"Peak-memory saving against {ref} (allocated/reserved: CUDA allocator; rss: worker process)",
                   f"saving vs {ref}")


PHASES = ("forward", "backward", "optimizer")


def _long_medians(results: pd.DataFrame, columns: list[str], name: str) -> pd.DataFrame:
    """Per-row metric columns -> one row per case and metric, the median across ok repeats."""
    ok = identity.keyed(results[results["status"] == "ok"])
    ok["machine"] = machine_label(ok)
    keys = identity.group_keys() + ["machine", "precision"]
    long = ok.melt(id_vars=keys, value_vars=columns, var_name=name, value_name="value").dropna(subset=["value"])
    long = long.groupby(keys + [name], as_index=False)["value"].median()
    long["_order"] = precision_sort_key(long["precision"])
    return long.sort_values(["batch_size", "_order"]).drop(columns="_order")


def phase_memory_chart(results: pd.DataFrame):
    """Per-phase peaks (forward / backward / optimizer step) side by side for FP32 and AMP."""
    columns = [f"peak_mem_{p}_bytes" for p in PHASES]
    if not all(c in results for c in columns) or results[columns].notna().sum().sum() == 0:
        return None
    long = _long_medians(results, columns, "phase")
    long["phase"] = long["phase"].str[len("peak_mem_"):-len("_bytes")]
    long["GiB"] = long["value"] / 2**30
    long["x"] = _x_label(long) + " · " + long["precision"]
    fig = _px().bar(long, x="x", y="GiB", color="phase", barmode="group", hover_data={"value": ":,.0f", "x": False},
                    labels={"x": "batch size · precision", "value": "bytes"}, **_facets(long))
    return _finish(fig, "Peak memory per phase of the step (only activations shrink under autocast)", "peak (GiB)")


def throughput_chart(summary: pd.DataFrame):
    frame = summary[summary["throughput"].notna()].copy()
    if frame.empty:
        return None
    frame = frame.sort_values("batch_size")
    frame["layout"] = np.where(frame["channels_last"], "channels_last", "nchw")
    fig = _px().line(frame, x="batch_size", y="throughput", color="precision", markers=True,
                     line_dash="layout" if frame["layout"].nunique() > 1 else None, color_discrete_map=modes.colours(),
                     hover_data={"step_time_ms": ":.2f", "repeats_ok": True, "status_counts": True},
                     labels={"batch_size": "batch size", "throughput": "samples / s"}, **_facets(frame))
    fig.update_xaxes(type="log")
    return _finish(fig, "Throughput against batch size (samples per second over the measured window)", "samples / s")


def scaling_chart(summary: pd.DataFrame):
    """Weak-scaling efficiency (1-process step time / N-process step time) per precision against
    the DDP world size: does AMP's speedup survive data-parallel scaling?"""
    if "world_size" not in summary or not (summary["world_size"] > 1).any():
        return None
    frame = summary[summary["scaling_efficiency"].notna()].copy()
    if frame.empty:
        return None
    frame["x"] = _x_label(frame, without=("nproc_per_node", "world_size"))  # the x axis is the world size
    frame = frame.sort_values("world_size")
    fig = _px().line(frame, x="world_size", y="scaling_efficiency", color="precision", markers=True,
                     line_dash="x" if frame["x"].nunique() > 1 else None, color_discrete_map=modes.colours(),
                     hover_data={"step_time_ms": ":.2f", "throughput": ":.1f",
                                 f"speedup_vs_{modes.reference()}": ":.2f"},
                     labels={"world_size": "processes (world size)", "scaling_efficiency": "scaling efficiency",
                             "x": "batch per process"}, **_facets(frame))
    fig.update_xaxes(type="log", dtick=np.log10(2))
    fig.add_hline(y=1.0, line_dash="dot", line_color="grey")
    return _finish(fig, "DDP scaling efficiency (weak scaling: batch per process fixed; 1.0 = perfect)", "efficiency")


def step_time_chart(samples: pd.DataFrame):
    """Per-step time distributions, so a noisy case is visible."""
    if samples.empty:
        return None
    frame = samples.copy()
    frame["x"] = _x_label(frame)
    fig = _px().box(frame, x="x", y="step_time_ms", color="precision", points="outliers",
                    color_discrete_map=modes.colours(),
                    hover_data={"repeat": True, "step": True}, labels={"x": "batch size"}, **_facets(frame))
    return _finish(fig, "Per-step time distribution over the measured steps (all repeats)", "step time (ms)")


def scaler_chart(results: pd.DataFrame):
    if "scaler_skipped_steps" not in results or not (results["scaler_skipped_steps"] > 0).any():
        return None
    frame = results[results["precision"].isin(modes.scaler_names())].copy()
    frame["machine"] = machine_label(frame)
    frame["x"] = _x_label(frame) + " " + frame["precision"] + " r" + frame["repeat"].astype(str)
    fig = _px().bar(frame, x="x", y="scaler_skipped_steps", hover_data={"scaler_final_scale": True, "steps": True},
                    labels={"x": "case and repeat", "scaler_skipped_steps": "skipped steps"}, **_facets(frame))
    return _finish(fig, "GradScaler skipped optimizer steps inside the measured window (those steps did less work)",
                   "skipped steps")


def worker_time_chart(results: pd.DataFrame):
    """Each worker's own wall time by phase (analysis/wall_time.py): what the window cost beside the start,
    the build, cuDNN's autotuning or a compile in the first step, and the probes after it."""
    from amp_bench.analysis.wall_time import OWN_PHASES, phase_frame
    frame = phase_frame(results)
    if frame.empty:
        return None
    frame["worker"] = frame["label"] + " r" + frame["repeat"].astype(int).astype(str)
    long = frame.melt(id_vars=["worker", "own_s"], value_vars=OWN_PHASES, var_name="phase", value_name="seconds")
    long = long[long["seconds"] > 0]
    fig = _px().bar(long, y="worker", x="seconds", color="phase", orientation="h",
                    category_orders={"phase": OWN_PHASES, "worker": list(frame["worker"])},
                    hover_data={"own_s": ":.2f"}, labels={"worker": "", "own_s": "worker's own time (s)"})
    fig.update_layout(template=TEMPLATE, barmode="stack", height=max(300, 24 * len(frame) + 120),
                      title="Where each worker's own wall time went, launch to reap (lockstep waits left out)")
    fig.update_xaxes(title_text="seconds")
    return fig


def energy_and_mfu_chart(summary: pd.DataFrame, results: pd.DataFrame):
    columns = [c for c in ("energy_j_per_sample", "mfu") if c in results and results[c].notna().any()]
    if not columns:
        return None
    long = _long_medians(results, columns, "metric")
    long["x"] = _x_label(long) + " · " + long["metric"]
    fig = _px().bar(long, x="x", y="value", color="precision", barmode="group", color_discrete_map=modes.colours(),
                    labels={"x": "batch size · metric"}, **_facets(long))
    return _finish(fig, "Energy per sample (J) and model-FLOPs utilisation", "value")


def history_chart(results: pd.DataFrame):
    """Step time per run for every case and machine with at least three runs; confirmed changes marked."""
    from amp_bench.analysis.gate.history import analyse
    series, changes = analyse(results)
    counts = series.groupby(["case_id", "fingerprint"])["run_id"].transform("size") if not series.empty else None
    if series.empty or counts.max() < 3:
        return None
    series = series[counts >= 3].copy()
    series["series"] = series["case_id"] + " @ " + series["fingerprint"]
    fig = _px().line(series, x="timestamp", y="step_time_ms", color="series", markers=True,
                     hover_data={"run_id": True, "throughput": ":.1f"},
                     labels={"timestamp": "run (UTC)", "step_time_ms": "median step time (ms)"})
    import plotly.graph_objects as go
    marks = [c for c in changes if c.metric == "step_time_ms"]
    if marks:
        lookup = series.set_index(["case_id", "fingerprint", "run_id"])
        xs, ys, texts = [], [], []
        for c in marks:
            if (c.case_id, c.fingerprint, c.run_id) in lookup.index:
                row = lookup.loc[(c.case_id, c.fingerprint, c.run_id)]
                xs.append(row["timestamp"])
                ys.append(row["step_time_ms"])
                texts.append(f"{c.kind} {c.ratio - 1:+.1%}" + (" (accepted)" if c.accepted else ""))
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="markers+text", text=texts, textposition="top center",
                                 marker=dict(symbol="star", size=14, color="black"), name="confirmed change"))
    fig.update_layout(title="Nightly history: median step time per run (stars: confirmed changes)",
                      template=TEMPLATE, height=420, legend_title_text="")
    return fig


def fidelity_chart(steps: pd.DataFrame, epochs: pd.DataFrame):
    """Training loss per step (smoothed over an epoch) and held-out accuracy per epoch, one line per
    precision and seed, so an AMP curve that leaves fp32's seed-to-seed band shows at once."""
    if epochs.empty:
        return None
    from plotly.subplots import make_subplots
    fig = make_subplots(rows=1, cols=2, subplot_titles=("training loss (running mean over an epoch)",
                                                         "held-out accuracy after each epoch"))
    per_epoch = max(1, int(steps.groupby(["run_id", "precision", "seed"]).size().max() /
                           max(1, epochs["epoch"].max() + 1))) if not steps.empty else 1
    shown = set()
    for (_, precision, seed), group in steps.groupby(["run_id", "precision", "seed"], sort=False):
        group = group.sort_values("step")
        fig.add_scatter(x=group["step"], y=group["loss"].rolling(per_epoch, min_periods=1).mean(), mode="lines",
                        name=precision, legendgroup=precision, showlegend=precision not in shown,
                        line=dict(color=modes.colours().get(precision), width=1.5), row=1, col=1,
                        hovertemplate=f"{precision} seed {seed}<br>step %{{x}}<br>loss %{{y:.4f}}<extra></extra>")
        shown.add(precision)
    for (_, precision, seed), group in epochs.groupby(["run_id", "precision", "seed"], sort=False):
        group = group.sort_values("epoch")
        fig.add_scatter(x=group["epoch"] + 1, y=group["test_accuracy"] * 100, mode="lines+markers",
                        name=precision, legendgroup=precision, showlegend=precision not in shown,
                        line=dict(color=modes.colours().get(precision), width=1.5), marker=dict(size=4), row=1, col=2,
                        hovertemplate=f"{precision} seed {seed}<br>epoch %{{x}}<br>%{{y:.2f}}%<extra></extra>")
        shown.add(precision)
    fig.update_xaxes(title_text="step", row=1, col=1)
    fig.update_xaxes(title_text="epoch", row=1, col=2)
    fig.update_yaxes(title_text="loss", type="log", row=1, col=1)
    fig.update_yaxes(title_text="accuracy (%)", row=1, col=2)
    fig.update_layout(template=TEMPLATE, height=420, title="Same seed, same data, same order: fp32 against AMP",
                      margin=dict(t=80, r=20))
    return fig


def loss_scale_chart(steps: pd.DataFrame):
    """GradScaler's loss scale over the run, skipped steps marked; a scale under 1 is drawn as such."""
    scaled = steps[steps["scale"].notna()] if "scale" in steps else steps.iloc[0:0]
    if scaled.empty:
        return None
    import plotly.graph_objects as go
    fig = go.Figure()
    for (_, precision, seed), group in scaled.groupby(["run_id", "precision", "seed"], sort=False):
        group = group.sort_values("step")
        fig.add_scatter(x=group["step"], y=group["scale"], mode="lines", name=f"{precision} seed {seed}",
                        line=dict(width=1.5, shape="hv"))
        skipped = group[true_rows(group["skipped"])]
        if not skipped.empty:
            fig.add_scatter(x=skipped["step"], y=skipped["scale"], mode="markers", name=f"skipped (seed {seed})",
                            marker=dict(symbol="x", size=9, color=modes.colours().get(precision)))
    # on a log axis plotly places an hline's own annotation at 10**y: label the line by hand
    fig.add_hline(y=1, line_dash="dot", line_color="#999")
    fig.add_annotation(y=0, yref="y", x=1, xref="paper", text="scale 1", showarrow=False, yanchor="bottom")
    fig.update_yaxes(type="log", title_text="loss scale (after the step)")
    fig.update_xaxes(title_text="step")
    fig.update_layout(template=TEMPLATE, height=380, title="GradScaler loss scale (x: a skipped optimizer step)",
                      margin=dict(t=80, r=20))
    return fig


def fp8_scale_chart(scales: pd.DataFrame):
    """fp8 fidelity runs: the amax of the first float8 layers' inputs and weights at each step (seed 0
    of each run: the seeds behave alike and overlaid they hide each other)."""
    import plotly.graph_objects as go
    fig = go.Figure()
    for (_, layer, tensor), group in scales.groupby(["run_id", "layer", "tensor"], sort=False):
        group = group[group["seed"] == group["seed"].min()].sort_values("step")
        fig.add_scatter(x=group["step"], y=group["amax"], mode="lines", name=f"{layer} {tensor}",
                        line=dict(width=1.5, dash="dot" if tensor == "weight" else "solid"),
                        customdata=group["scale"], hovertemplate="step %{x}: amax %{y:.4g}, scale %{customdata:.4g}")
    fig.update_yaxes(type="log", title_text="amax (scale = 448 / amax)")
    fig.update_xaxes(title_text="step")
    fig.update_layout(template=TEMPLATE, height=380, title="fp8: amax per step (solid: input, dotted: weight)",
                      margin=dict(t=80, r=20))
    return fig


def headroom_chart(headroom: pd.DataFrame):
    """Largest batch that trains per model and precision (text: multiple of fp32's), and the
    throughput measured at that batch."""
    frame = headroom[headroom["status"] == "ok"].copy()
    if frame.empty:
        return None
    from plotly.subplots import make_subplots
    fig = make_subplots(rows=1, cols=2, subplot_titles=("largest batch that trains", "samples/s at that batch"))
    frame = frame.sort_values("precision", key=precision_sort_key, kind="stable")
    for precision, group in frame.groupby("precision", sort=False):
        text = [("" if r != r else f"{r:.2f}x") + (" (limit)" if is_true(lim) else "")
                for r, lim in zip(group["batch_ratio_vs_fp32"], group["limit_reached"], strict=True)]
        fig.add_bar(x=group["model_label"], y=group["max_batch_size"], name=precision, legendgroup=precision,
                    marker_color=modes.colours().get(precision), text=text, textposition="outside", row=1, col=1)
        fig.add_bar(x=group["model_label"], y=group["throughput_at_max"], name=precision, legendgroup=precision,
                    showlegend=False, marker_color=modes.colours().get(precision),
                    text=[f"{r:.2f}x" if r == r else "" for r in group["throughput_ratio_vs_fp32"]],
                    textposition="outside", row=1, col=2)
    fig.update_layout(template=TEMPLATE, height=420, barmode="group", margin=dict(t=80, r=20),
                      title="Batch-size headroom under the memory cap")
    fig.update_yaxes(title_text="batch size", row=1, col=1)
    fig.update_yaxes(title_text="samples/s", row=1, col=2)
    return fig
