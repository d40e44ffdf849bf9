"""The report's fidelity and headroom sections: tables as a person reads them, and the HTML and
markdown around the charts. The numbers come from fidelity.verdicts and headroom.ratios_vs_fp32."""
from __future__ import annotations

import numpy as np
import pandas as pd

from amp_bench import modes
from amp_bench.report import charts
from amp_bench.report.data import ReportData
from amp_bench.store.flags import is_true, text_column

VERDICT_CLASS = {"parity": "within", "worse": "below", "better": "above"}


def _pp(value) -> str:
    return "-" if value is None or value != value else f"{value:+.2f}"


def verdicts_for_reading(verdicts: pd.DataFrame) -> pd.DataFrame:
    def spread(row):
        low, high = row["accuracy_diff_pp_min"], row["accuracy_diff_pp_max"]
        return "-" if low != low or row["seeds"] < 2 else f"{low:+.2f} .. {high:+.2f}"
    return pd.DataFrame({
        "dataset": verdicts["dataset"], "model": verdicts["model"], "precision": verdicts["precision"],
        "seeds": verdicts["seeds"], "status": verdicts["status"], "test accuracy (%)": verdicts["test_accuracy"] * 100,
        "vs fp32 (pp)": verdicts["accuracy_diff_pp"].map(_pp), "per-seed range (pp)": verdicts.apply(spread, axis=1),
        "fp32 seed-to-seed range (pp)": verdicts["fp32_seed_range_pp"],
        "final train loss": verdicts["final_train_loss"],
        "train loss vs fp32": verdicts["train_loss_rel_diff"].map(lambda v: "-" if v != v else f"{v:+.1%}"),
        "tolerance (pp)": verdicts["tolerance_pp"], "verdict": verdicts["verdict"],
        # a mode judged against a second reference too (fp8 against bf16)
        "second reference": text_column(verdicts, "also_against"),
        "vs it (pp)": verdicts["accuracy_diff_also_pp"].map(_pp) if "accuracy_diff_also_pp" in verdicts else "",
        "verdict vs it": text_column(verdicts, "verdict_also")})


def scaler_health_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Per AMP run: what the loss scale did, and the share of gradient elements lost to zero."""
    amp = runs[runs["precision"].isin(modes.amp_names())]
    if amp.empty:
        return pd.DataFrame()

    def pct(v):
        return "-" if v != v else f"{v:.4%}"

    def indices(value):
        text = "" if value != value else str(value)
        items = [str(int(float(i))) for i in text.split()]
        return " ".join(items[:12]) + (f" ... ({len(items)})" if len(items) > 12 else "") if items else "-"
    has_scaler = amp["scaler_initial_scale"].notna()
    return pd.DataFrame({
        "model": amp["dataset"] + "/" + amp["model"], "precision": amp["precision"], "seed": amp["seed"],
        "status": amp["status"],
        "skipped steps": np.where(has_scaler, amp["scaler_skipped_steps"].fillna(0).astype(int).astype(str),
                                  "no scaler"),
        "skipped at step": amp["scaler_skipped_step_indices"].map(indices),
        "scale: initial": amp["scaler_initial_scale"], "min": amp["scaler_min_scale"],
        "final": amp["scaler_final_scale"],
        "fell below 1": amp["scaler_scale_below_one"].map(lambda v: "-" if pd.isna(v) else "YES" if v else "no"),
        "grads lost, unscaled": amp["grad_underflow_fraction_unscaled"].map(pct),
        "grads lost, with scaler": amp["grad_underflow_fraction_scaled"].map(pct),
        "zero grads in fp32": amp["grad_zero_fraction_fp32"].map(pct)})


def headroom_for_reading(headroom: pd.DataFrame) -> pd.DataFrame:
    def cap(v):
        return "none" if v != v or v is None else f"{v / 2**30:.3g} GiB"
    return pd.DataFrame({
        "device": headroom["device_name"], "model": headroom["model_label"], "processes": headroom["world_size"],
        "precision": headroom["precision"], "status": headroom["status"], "largest batch": headroom["max_batch_size"],
        "first OOM": headroom["first_oom_batch_size"],
        "limit reached": headroom["limit_reached"].map(lambda v: "yes" if is_true(v) else ""),
        "x fp32's batch": [("-" if v != v else ("≥" if is_true(lb) else "") + f"{v:.2f}x")
                           for v, lb in zip(headroom["batch_ratio_vs_fp32"], headroom["batch_ratio_is_lower_bound"],
                                            strict=True)],
        "samples/s there": headroom["throughput_at_max"],
        "x fp32's samples/s": headroom["throughput_ratio_vs_fp32"].map(lambda v: "-" if v != v else f"{v:.2f}x"),
        "memory cap": headroom["memory_cap_bytes"].map(cap), "probes": headroom["probes"],
        "reason": text_column(headroom, "reason")})


def figures(data: ReportData) -> list[tuple[str, str, object]]:
    out = []
    if data.has_fidelity:
        out += [("fidelity", "Accuracy parity on real data",
                 charts.fidelity_chart(data.fidelity["fidelity_steps"], data.fidelity["fidelity_epochs"])),
                ("loss-scale", "GradScaler health", charts.loss_scale_chart(data.fidelity["fidelity_steps"]))]
        scales = data.fidelity.get("fidelity_fp8_scales")
        if scales is not None and not scales.empty:
            out.append(("fp8-scales", "fp8: amax and scale of the first float8 layers", charts.fp8_scale_chart(scales)))
    if data.has_headroom:
        out.append(("headroom", "Batch-size headroom", charts.headroom_chart(data.headroom["headroom"])))
    return out


def section_html(section: str, data: ReportData, table_html) -> str:
    """What follows a study chart: its tables and how to read them."""
    if section == "fidelity":
        return ("<p class='note'>Seed articles: AMP brings \"no visible accuracy loss\". Each precision trains from "
                "the same seed on the same shipped data in the same order; accuracy is on the held-out split, "
                "differences are paired by seed. Verdict: parity when the mean difference is within the "
                "tolerance; compare it with fp32's own seed-to-seed range.</p>"
                + table_html(verdicts_for_reading(data.fidelity["verdicts"]),
                             lambda c, r: VERDICT_CLASS.get(r[c], "") if c == "verdict" else ""))
    if section == "loss-scale":
        health = scaler_health_table(data.fidelity["fidelity"])
        if health.empty:
            return "<p class='note'>No AMP run in these fidelity results.</p>"
        return ("<p class='note'>A skipped step is one whose gradients overflowed at the current scale (the scale "
                "halves). 'Grads lost' is the share of gradient elements that are non-zero in FP32 but exactly zero "
                "under autocast on the same weights and batch (worst probe of the run): unscaled, it is what fp16 "
                "loses without GradScaler; with the scaler, what it still loses. A scale below 1 means the model "
                "overflows fp16 even unscaled.</p>"
                + table_html(health, lambda c, r: "below" if c == "fell below 1" and r[c] == "YES" else ""))
    if section == "fp8-scales":
        return ("<p class='note'>Dynamic float8 scaling (torchao): each step the input and the weight of a float8 "
                "layer are scaled by E4M3's largest value (448) over their absolute maximum (amax) before the cast. "
                "A scale that swings by orders of magnitude, or an amax near zero, is where fp8 loses precision.</p>")
    if section == "headroom":
        return ("<p class='note'>Seed articles: with AMP \"larger batch sizes fit\". Each probe trains a few steps "
                "in its own worker under the memory cap; the search doubles the batch, then bisects until the "
                "largest batch that fits and the smallest that runs out are 'resolution' apart. Throughput is "
                "measured at each precision's own largest batch.</p>"
                + table_html(headroom_for_reading(data.headroom["headroom"])))
    return ""


def markdown(data: ReportData, table_md) -> list[str]:
    lines = []
    if data.has_fidelity:
        lines += ["## Accuracy parity (fidelity)", "", table_md(verdicts_for_reading(data.fidelity["verdicts"])), ""]
        health = scaler_health_table(data.fidelity["fidelity"])
        if not health.empty:
            lines += ["## GradScaler health", "", table_md(health), ""]
    if data.has_headroom:
        lines += ["## Batch-size headroom", "", table_md(headroom_for_reading(data.headroom["headroom"])), ""]
    return lines


def csv_tables(data: ReportData) -> dict[str, pd.DataFrame]:
    out = {}
    if data.has_fidelity:
        out["fidelity_verdicts"] = data.fidelity["verdicts"]
    if data.has_headroom:
        out["headroom"] = data.headroom["headroom"]
    return out
