"""Writing the report: one self-contained HTML file (plotly.js inlined, no CDN, no network), a
markdown summary, the tidy tables as CSV, and optional static images."""
from __future__ import annotations

import datetime as dt
import html
from pathlib import Path

import numpy as np
import pandas as pd

from amp_bench import modes
from amp_bench.analysis.headline import headlines
from amp_bench.report import charts, compile_section, explain_section, gpus_section, predict_section, study_sections
from amp_bench.report import data as report_data
from amp_bench.report.data import ReportData
from amp_bench.store.flags import is_true, true_rows

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;max-width:1200px;color:#222}
h1{margin-bottom:.2em} h2{margin-top:2em;border-bottom:1px solid #ddd;padding-bottom:.2em}
.scroll{overflow-x:auto} table{border-collapse:collapse;font-size:13px;margin:.5em 0}
th,td{border:1px solid #ddd;padding:3px 7px;text-align:right;white-space:nowrap}
th{white-space:normal;vertical-align:bottom} td.text{white-space:normal;text-align:left;min-width:8em;max-width:28em}
th{background:#f4f4f4} td:first-child,th:first-child{text-align:left}
.within{background:#e3f6e3} .below{background:#fde2e1} .above{background:#e1ecfd} .differs{background:#fff4cc}
.note{color:#666;font-size:13px} .chart{margin:1em 0}
.headline{font-size:16px;border-left:4px solid #636efa;padding:.2em 1em;background:#f7f8ff}
.warn{background:#fde2e1;padding:.5em 1em}
"""


def _fmt_cell(value, column: str) -> str:
    if value is None or value is pd.NA or (isinstance(value, float) and not np.isfinite(value)):
        return "-"
    if isinstance(value, (float, np.floating)):
        if "saving" in column or column in ("mfu", "scaling efficiency"):
            return f"{value:.1%}"
        return f"{value:.2f}x" if "speedup" in column else f"{value:.4g}"
    return str(value)


def html_table(frame: pd.DataFrame, cell_class=None) -> str:
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in frame.columns)
    body = []
    for _, row in frame.iterrows():
        cells = []
        for column in frame.columns:
            text = _fmt_cell(row[column], column)
            # long words (notes, reasons, environment values) wrap inside the page; figures never do
            css = " ".join(c for c in (cell_class(column, row) if cell_class else "",
                                       "text" if len(text) > 24 else "") if c)
            cls = f' class="{css}"' if css else ""
            cells.append(f"<td{cls}>{html.escape(text)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<div class='scroll'><table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table></div>"


def markdown_table(frame: pd.DataFrame) -> str:
    rows = ["| " + " | ".join(_fmt_cell(row[c], c).replace("|", "/") for c in frame.columns) + " |"
            for _, row in frame.iterrows()]
    return "\n".join(["| " + " | ".join(map(str, frame.columns)) + " |", "|" + "---|" * len(frame.columns), *rows])


def summary_for_reading(summary: pd.DataFrame) -> pd.DataFrame:
    """The summary as a person reads it: fewer columns, units in the names, spread as a range."""
    ref, others = modes.reference(), modes.baseline_names()[1:]  # the registry names the baselines

    def spread(row):
        low, high = row[f"speedup_vs_{ref}_min"], row[f"speedup_vs_{ref}_max"]
        several = np.isfinite(low) and np.isfinite(high) and row[f"speedup_vs_{ref}_pairs"] > 1
        return f"{low:.2f}-{high:.2f}x" if several else "-"
    columns = {
        "machine": summary["machine"], "model": summary["model_label"], "batch": summary["batch_size"].astype(int),
        "precision": precision_labels(summary), "status": summary["status_counts"],
        "step ms": summary["step_time_ms"], "samples/s": summary["throughput"],
        f"speedup vs {ref}": summary[f"speedup_vs_{ref}"], "repeat range": summary.apply(spread, axis=1)}
    # a later baseline's column only where it was run (tf32 runs only on CUDA >= 8.0)
    columns |= {f"speedup vs {b}": summary[f"speedup_vs_{b}"] for b in others
                if f"speedup_vs_{b}" in summary and summary[f"speedup_vs_{b}"].notna().any()}
    columns |= {"peak memory (MiB)": summary["peak_mem_bytes"] / 2**20,
                f"memory saving vs {ref}": summary[f"mem_saving_vs_{ref}"], "notes": caveats(summary)}
    table = pd.DataFrame(columns)
    if summary["channels_last"].any():  # the summary's keys are typed (identity.keyed)
        table.insert(3, "layout", np.where(summary["channels_last"], "channels_last", "nchw"))
    if "world_size" in summary and (summary["world_size"] > 1).any():  # DDP: weak scaling
        table.insert(3, "procs", summary["world_size"].astype(int))
        table.insert(table.columns.get_loc(f"speedup vs {ref}") + 1, "scaling efficiency",
                     summary["scaling_efficiency"])
    return table


def precision_labels(summary: pd.DataFrame) -> pd.Series:
    """'amp_bf16 (emulated)': an emulated mode is never shown without saying so."""
    flags = summary["emulated"] if "emulated" in summary else pd.Series(False, index=summary.index)
    return pd.Series([modes.with_emulated(p, is_true(e))
                      for p, e in zip(summary["precision"], flags, strict=True)], index=summary.index, dtype=object)


def caveats(summary: pd.DataFrame) -> pd.Series:
    """Why a row's figure needs care: emulated (and why), contended (and how)."""
    def text(row) -> str:
        notes = []
        if is_true(row.get("emulated")):
            notes.append(f"emulated: {row.get('emulated_reason') or 'no native hardware for this dtype'}")
        if is_true(row.get("contended")):
            notes.append(f"contended: {row.get('contention')}")
        return "; ".join(notes)
    return summary.apply(text, axis=1) if not summary.empty else pd.Series(dtype=object)


def claims_for_reading(claims: pd.DataFrame) -> pd.DataFrame:
    table = claims.drop(columns=["speedup_claim", "memory_claim"]).rename(columns={
        "batch_size": "batch", "speedup_verdict": "speedup verdict", "memory_saving": "memory saving",
        "memory_verdict": "memory verdict", "memory_metric": "memory metric"})
    if not table["channels_last"].any():
        table = table.drop(columns="channels_last")
    return table


def machine_count(data: ReportData) -> int:
    """Distinct (device, host) pairs across benchmark, fidelity and headroom rows."""
    frames = [data.results] + [t for t in (data.fidelity.get("fidelity"), data.headroom.get("headroom"))
                               if t is not None]
    pairs = set()
    for frame in frames:
        if not frame.empty and "device_name" in frame:
            hosts = frame["hostname"] if "hostname" in frame else pd.Series("", index=frame.index)
            pairs |= set(zip(frame["device_name"].astype(str), hosts.astype(str), strict=True))
    return len(pairs)


def build_figures(data: ReportData, summary: pd.DataFrame) -> list[tuple[str, str, object]]:
    """(section id, title, figure or None) in report order."""
    results = data.results.copy()
    if not data.has_benchmarks:  # a fidelity or headroom run only
        return study_sections.figures(data)
    scaling = charts.scaling_chart(summary)  # a section only when the results hold DDP runs
    return [
        *[("speedup" if base == modes.reference() else f"speedup-{base}", f"Speedup over {base.upper()}",
           charts.speedup_chart(summary, base)) for base in modes.baseline_names()],
        ("memory", "Memory saving", charts.memory_chart(summary)),
        ("phases", "Memory per phase", charts.phase_memory_chart(results)),
        *explain_section.figures(results),
        *predict_section.figures(data),  # what other GPUs would give (analysis/predict/)
        ("throughput", "Throughput against batch size", charts.throughput_chart(summary)),
        *([("scaling", "Scaling across processes (DDP)", scaling)] if scaling is not None else []),
        *([("compile", "torch.compile: precision x compile mode", compile_section.heatmap(summary))]
          if compile_section.has_compile(summary) else []),
        ("distributions", "Step-time distributions", charts.step_time_chart(report_data.step_samples(data))),
        ("energy", "Energy and MFU", charts.energy_and_mfu_chart(summary, results)),
        ("scaler", "GradScaler skipped steps", charts.scaler_chart(results)),
        ("worker-time", "Where each worker's time went", charts.worker_time_chart(results)),
        ("machines", gpus_section.TITLE, gpus_section.figure(gpus_section.table(data))),
        ("history", "History", charts.history_chart(results)),
    ] + study_sections.figures(data)


ABSENT = {
    "speedup-tf32": "No tf32 baseline in these results (tf32 runs only on CUDA GPUs with compute capability >= 8.0).",
    "phases": "These results carry no per-phase memory (forward / backward / optimizer) peaks.",
    "explain": explain_section.ABSENT,
    "predict": predict_section.ABSENT,
    "energy": "These results carry no energy or MFU figures (they come from NVML and FLOP counting on GPUs).",
    "scaler": "GradScaler skipped no step in any measured window.",
    "worker-time": "These results carry no worker phases (rows written before the phase columns existed).",
    "machines": gpus_section.ABSENT,
    "history": "Fewer than three runs of any case on one machine: the history chart needs a series.",
    "fidelity": "No fidelity run finished an epoch.",
    "loss-scale": "No run used GradScaler (it is on for amp_fp16 only).",
    "headroom": "No headroom search found a batch that fits.",
}
STUDY_SECTIONS = ("fidelity", "loss-scale", "headroom")


def render_html(data: ReportData, summary: pd.DataFrame, claims: pd.DataFrame, env: pd.DataFrame,
                missing: pd.DataFrame, figures) -> str:
    parts = _opening_html(data, summary)
    if not missing.empty:
        parts += ["<h2 id='not-measured'>Cases not measured</h2>",
                  "<p class='note'>These are shown as such in the charts, never as zero.</p>", html_table(missing)]
    if data.has_benchmarks:
        parts.append("<h2 id='summary'>Summary</h2>" + html_table(summary_for_reading(summary)))
    parts += _sections_html(data, summary, missing, figures)
    if data.has_benchmarks:
        parts += _claims_html(claims)
    differs = set(env.attrs.get("differs", []))
    parts += ["<h2 id='environment'>Environment</h2>",
              "<p class='note'>Highlighted: what differs between the runs compared here.</p>",
              html_table(env, lambda c, r: "differs" if c in differs else ""), "</body></html>"]
    return "\n".join(parts)


def _opening_html(data: ReportData, summary: pd.DataFrame) -> list[str]:
    """The page's head, what it covers, the headline, and the warnings that belong before any figure."""
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>amp_bench report</title>"
             f"<style>{CSS}</style></head><body>",
             "<h1>What AMP bought</h1>",
             f"<p class='note'>{len(data.run_dirs)} run(s), {len(data.results)} case runs, "
             f"{machine_count(data)} machine(s); written {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC "
             "by amp_bench. Speedups are paired: each repeat's ratio of median step times (the two modes ran back "
             "to back, or on the CPU in lockstep, their workers taking turns), their 20%-trimmed mean on the log "
             "scale; error bars are their 95% intervals.</p>"]
    if data.has_benchmarks:
        sentences = headlines(summary)
        if sentences:
            parts.append("<div class='headline'>" + "".join(f"<p>{html.escape(s)}</p>" for s in sentences) + "</div>")
        parts += _contended_html(summary)
    for run, state in data.unfinished_runs:
        parts.append("<p class='warn'>" + html.escape(f"Run {run} did not finish ({state}); the cases it finished "
                                                      "are shown.") + "</p>")
    return parts


def _contended_html(summary: pd.DataFrame) -> list[str]:
    """Cases whose figures rest on a shared machine (not trustworthy), and those that only lost pairs to it
    (left out: the figures are from the clean pairs), each said once."""
    if "contended" not in summary:
        return []
    ref = modes.reference()
    contended = summary[true_rows(summary["contended"])]
    untrusted = contended[true_rows(contended.get(f"contended_vs_{ref}", pd.Series(False, index=contended.index)))
                          | (contended["status"] != "ok")]
    dropped = contended.drop(index=untrusted.index)
    parts = []
    if not untrusted.empty:
        parts.append("<p class='warn'>Contended: " + html.escape(
            f"{len(untrusted)} case(s) did not get their machine during the measured window (another process "
            f"used it); their figures are not trustworthy: {untrusted['contention'].iloc[0]}") + "</p>")
    if not dropped.empty:
        parts.append("<p class='note'>" + html.escape(
            f"{len(dropped)} case(s) lost repeats to another process: those pairs are left out, and their figures "
            f"come from the clean pairs (the headline says how many): {dropped['contention'].iloc[0]}") + "</p>")
    return parts


def _sections_html(data: ReportData, summary: pd.DataFrame, missing: pd.DataFrame, figures) -> list[str]:
    """Each section: its heading, its study's tables, its chart (plotly.js inline once: the file must open
    on an air-gapped machine)."""
    parts, first = [], True
    tables = {"explain": lambda: explain_section.section_html(data.results, html_table, data.run_dirs),
              "predict": lambda: predict_section.section_html(data, html_table),
              "compile": lambda: compile_section.html(summary, html_table),
              "machines": lambda: gpus_section.section_html(gpus_section.table(data), data, html_table)}
    for section, title, figure in figures:
        parts.append(f"<h2 id='{section}'>{html.escape(title)}</h2>")
        if figure is None:
            parts.append(f"<p class='note'>{html.escape(ABSENT.get(section, 'Nothing to show.'))}</p>")
        if section in tables:
            parts.append(tables[section]())
        if section in STUDY_SECTIONS:
            parts.append(study_sections.section_html(section, data, html_table))
        if figure is None:
            continue
        chart = figure.to_html(full_html=False, include_plotlyjs=first, div_id=f"chart-{section}",
                               config={"displaylogo": False})
        parts.append(f"<div class='chart'>{chart}</div>")
        if not missing.empty and section not in ("distributions", "scaler") + STUDY_SECTIONS:
            parts.append("<p class='note'>Cases without a measurement (or without a baseline) have no mark here "
                         "except the labelled crosses on the speedup charts: see <a href='#not-measured'>Cases not "
                         "measured</a>.</p>")
        first = False
    return parts


def _claims_html(claims: pd.DataFrame) -> list[str]:
    (fast, faster), (saves, saves_more) = report_data.CLAIMED_SPEEDUP, report_data.CLAIMED_MEMORY_SAVING
    return ["<h2 id='claims'>The claims, checked</h2>",
            f"<p class='note'>Seed articles: AMP is {fast}-{faster}x faster and saves "
            f"{saves:.0%}-{saves_more:.0%} memory. Each AMP case against fp32 and, "
            "where run, against tf32 — on Ampere and later TF32 is what 'FP32' means to most users. Verdicts: "
            "below, within or above the claimed range.</p>",
            html_table(claims_for_reading(claims), lambda c, r: str(r[c]).split(" ")[0] if c.endswith("verdict")
                       and str(r[c]).split(" ")[0] in ("within", "below", "above") else "")
            if not claims.empty else "<p>No AMP case in these results.</p>"]


def render_markdown(data: ReportData, summary: pd.DataFrame, claims: pd.DataFrame, missing: pd.DataFrame) -> str:
    lines = ["# amp_bench report", "",
             f"{len(data.run_dirs)} run(s), {machine_count(data)} machine(s). Speedup = the 20%-trimmed "
             "mean (log scale) of each repeat's ratio of median step times (the modes ran one after the other, or on "
             "the CPU in lockstep, their workers taking turns), with its 95% interval; memory "
             f"saving = peak allocated (CUDA) or peak RSS (CPU) against {modes.reference()}.", ""]
    if data.has_benchmarks:
        lines += [f"- {sentence}" for sentence in headlines(summary)] + [""]
    lines += [f"> Run {run} did not finish ({state}); the cases it finished are shown." for run, state in
              data.unfinished_runs] + ([""] if data.unfinished_runs else [])
    ref = modes.reference()
    columns = ["machine", "model_label", "batch_size", "precision", "status", "step_time_ms", f"speedup_vs_{ref}",
               *[f"speedup_vs_{b}" for b in modes.baseline_names()[1:]], f"mem_saving_vs_{ref}", "notes"]
    if summary["channels_last"].any():
        columns.insert(3, "channels_last")
    if "world_size" in summary and (summary["world_size"] > 1).any():  # DDP: weak scaling, global samples/s
        columns.insert(3, "world_size")
        columns.insert(columns.index(f"speedup_vs_{ref}") + 1, "scaling_efficiency")
    telemetry = {"nvml_mem_used_delta_bytes": "nvml_delta_MiB", "energy_j_per_sample": "J/sample",
                 "achieved_tflops": "TFLOP/s", "mfu": "mfu"}
    table = summary.assign(precision=precision_labels(summary), notes=caveats(summary)).reindex(columns=columns)
    medians = _case_medians(data.results, summary, list(telemetry))
    if not medians.empty:
        table = table.join(medians)
        if "nvml_mem_used_delta_bytes" in table:
            table["nvml_mem_used_delta_bytes"] = table["nvml_mem_used_delta_bytes"] / 2**20
        table = table.rename(columns=telemetry)
    if data.has_benchmarks:
        lines += ["## Step time, speedup and memory saving", "", markdown_table(table), ""]
        synced = true_rows(data.results.get("scaler_host_sync"), data.results.index)
        if synced.any():  # the fp16 step pays a host sync the others don't: say so beside the speedups
            lines += ["GradScaler host sync: " + ", ".join(sorted(set(data.results.loc[synced, "case_id"]))) +
                      " ran a non-fused optimizer, so GradScaler read found_inf with .item() every step (a "
                      "host-device sync the bf16 and fp32 steps don't pay); a fused optimizer avoids it.", ""]
    lines += compile_section.markdown(summary, markdown_table)
    lines += gpus_section.markdown(gpus_section.table(data), data, markdown_table)
    lines += explain_section.markdown(data.results, markdown_table, data.run_dirs)
    lines += predict_section.markdown(data, markdown_table)
    if not claims.empty:
        lines += ["## Claims (1.5-3x faster, 40-50% less memory)", "", markdown_table(claims.reindex(columns=[
            "machine", "model", "batch_size", "precision", "baseline", "speedup", "speedup_verdict", "memory_saving",
            "memory_verdict"])), ""]
    if not missing.empty:
        lines += ["## Not measured", "", markdown_table(missing), ""]
    lines += study_sections.markdown(data, markdown_table)
    return "\n".join(lines)


def _case_medians(results: pd.DataFrame, summary: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """Median across ok repeats of per-row telemetry, aligned with the summary's rows (same case
    keys: run, model, batch, sizes, layout, device, precision)."""
    from amp_bench import identity
    present = [c for c in columns if c in results and results[c].notna().any()]
    if not present:
        return pd.DataFrame()
    keys = identity.group_keys() + ["precision"]
    medians = identity.keyed(results[results["status"] == "ok"]).groupby(keys)[present].median()
    return identity.keyed(summary)[keys].join(medians, on=keys)[present]


def write_images(figures, directory: Path, fmt: str) -> list[Path] | str:
    """Static images through plotly's image exporter; returns a one-line reason when unavailable."""
    written = []
    for section, _, figure in figures:
        if figure is None:
            continue
        path = directory / f"{section}.{fmt}"
        try:
            figure.write_image(str(path))
        except (ImportError, ValueError, RuntimeError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            return (f"static {fmt} images skipped: plotly's image exporter is not available ({first}); "
                    "`pip install kaleido` adds it")
        written.append(path)
    return written


def write_report(data: ReportData, output: Path, formats: tuple[str, ...] = ("html", "md", "csv"),
                 images: str | None = None) -> dict[str, object]:
    """Write the requested outputs next to `output` (reports/NAME.html); returns what was written."""
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    summary = data.summary
    claims = report_data.claims_table(summary, data.headroom_runs)
    env = report_data.environment_table(data)
    missing = report_data.not_measured(data.results)
    stem = output.with_suffix("")
    written: dict[str, object] = {}
    figures = build_figures(data, summary) if ("html" in formats or images) else []
    if "html" in formats:
        output.write_text(render_html(data, summary, claims, env, missing, figures), encoding="utf-8")
        written["html"] = output
    if "md" in formats:
        md = stem.with_suffix(".md")
        md.write_text(render_markdown(data, summary, claims, missing), encoding="utf-8")
        written["md"] = md
    if "csv" in formats:
        for name, table in (("summary", summary), ("claims", claims), ("environment", env), ("not_measured", missing),
                            ("explain", explain_section.category_table(data.results)),
                            ("explain_layers", explain_section.layer_table(data)),
                            ("advice", explain_section.advice_display(data.results, data.run_dirs)),
                            ("gpus", gpus_section.table(data)), ("predict", predict_section.predictions(data)[0]),
                            *study_sections.csv_tables(data).items()):
            path = Path(f"{stem}.{name}.csv")
            table.to_csv(path, index=False)
            written[f"csv_{name}"] = path
    if images:
        image_dir = Path(f"{stem}-images")
        image_dir.mkdir(exist_ok=True)
        written["images"] = write_images(figures, image_dir, images)
    return written
