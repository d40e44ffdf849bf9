"""The headline: one sentence per model and batch size that says what AMP bought on this machine,
with its interval, and every caveat that belongs next to the number (emulated, contended, not run).

    ResNet-50 bs 8 on AMD EPYC: bf16 autocast is 1.75x faster than fp32 (95% CI 1.70-1.81x), 21% less
    peak RSS.

Printed at the end of `run` and at the top of the report. Plotting-free and torch-free.
"""
from __future__ import annotations

import math
import re

import pandas as pd

from amp_bench import identity, modes
from amp_bench.store.flags import is_true


def _number(value) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _ratio_text(ratio: float, low: float | None, high: float | None, what: str, pairs: str = "") -> str:
    if ratio >= 1:
        text = f"{ratio:.2f}x faster than {what}"
        interval = (low, high)
    else:
        text = f"{1 / ratio:.2f}x slower than {what}"
        interval = (1 / high if high else None, 1 / low if low else None)
    inside = [f"95% CI {interval[0]:.2f}-{interval[1]:.2f}x"] if interval[0] and interval[1] else []
    if inside or pairs:
        text += f" ({'; '.join(inside + ([pairs] if pairs else []))})"
    return text


def _pairs_text(row: pd.Series, ref: str) -> str:
    """'5 of 6 pairs, 1 dropped: contended' when a disturbance cost the figure pairs; '' otherwise."""
    dropped, used = _number(row.get(f"speedup_vs_{ref}_dropped")), _number(row.get(f"speedup_vs_{ref}_pairs"))
    if not dropped or used is None:
        return ""
    return f"{used:.0f} of {used + dropped:.0f} pairs, {dropped:.0f} dropped: contended"


# the measured slowdown an emulated mode's reason carries (studies/emulation.sentence writes it)
MEASURED_EMULATION = re.compile(r"its largest (\w+(?: layer)?) \([^)]*\) ran (\d+x) slower")


def _clause(row: pd.Series, base: pd.Series | None) -> str:
    name = modes.label(row["precision"])
    if row["status"] != "ok":
        reason = str(row.get("reason") or "").split(" (not run:")[0]
        if row["status"] == "unsupported":  # the full reason is said once elsewhere (the run's notes, the report)
            short = reason.split(":")[0]
            slower = MEASURED_EMULATION.search(reason)
            short += f"; its largest {slower.group(1)} ran {slower.group(2)} slower here, measured" if slower else ""
            return f"{name} not run ({short}" + ("; allow_emulated: true measures it)" if is_true(row.get("emulated"))
                                                 else ")")
        return f"{name} {row['status']}" + (f" ({reason})" if reason else "")
    ref = modes.reference()  # the registry's baseline: every column below is named after it
    if base is None or base["status"] != "ok":
        return f"{name} measured, but the {ref} baseline is {base['status'] if base is not None else 'absent'}"
    ratio = _number(row.get(f"speedup_vs_{ref}"))
    if ratio is None:
        return f"{name}: no ratio"
    low, high = _number(row.get(f"speedup_vs_{ref}_ci_low")), _number(row.get(f"speedup_vs_{ref}_ci_high"))
    if low is None or high is None:  # results without per-step intervals: the spread of the repeats
        low, high = _number(row.get(f"speedup_vs_{ref}_min")), _number(row.get(f"speedup_vs_{ref}_max"))
        low, high = (low, high) if (low and high and low != high) else (None, None)
    if is_true(row.get(f"contended_vs_{ref}")) and _number(row.get(f"speedup_vs_{ref}_dropped")):
        total = (_number(row.get(f"speedup_vs_{ref}_pairs")) or 0) + _number(row.get(f"speedup_vs_{ref}_dropped"))
        clean = _number(row.get(f"speedup_vs_{ref}_clean")) or 0  # too few clean pairs left for a figure
        return (f"{name} contended: {clean:.0f} clean pair(s) of {total:.0f}, too few for an interval "
                f"({str(row.get('contention') or '').split(';')[0]})")
    text = f"{name} is {_ratio_text(ratio, low, high, ref, _pairs_text(row, ref))}"
    saving = _number(row.get(f"mem_saving_vs_{ref}"))
    if saving is not None:
        what = "peak RSS" if row.get("device") == "cpu" else "peak memory"
        text += f", {abs(saving):.0%} {'less' if saving >= 0 else 'more'} {what}"
    why = str(row.get("emulated_reason") or "no native hardware for this dtype").split(":")[0]
    text = modes.with_emulated(text, is_true(row.get("emulated")), why)
    if is_true(row.get(f"contended_vs_{ref}")):
        text += " [CONTENDED: the machine was shared during the window; not a trustworthy figure]"
    return text


def headlines(summary: pd.DataFrame) -> list[str]:
    """One sentence per case (model, batch size, layout, machine) with an AMP mode in it."""
    if summary.empty or "precision" not in summary:
        return []
    frame = identity.keyed(summary)
    sentences = []
    for _, case in frame.groupby(identity.group_keys(), dropna=False, sort=False):
        by_mode = {row["precision"]: row for _, row in case.iterrows()}
        amp = [p for p in modes.amp_names() if p in by_mode]
        if not amp:
            continue
        base = by_mode.get(modes.reference())
        amp.sort(key=lambda p: by_mode[p]["status"] != "ok")  # what was measured leads; what was not, last
        clauses = [_clause(by_mode[p], base) for p in amp]
        sentences.append(f"{identity.case_label(case.iloc[0])} on {case.iloc[0]['device_name']}: {'; '.join(clauses)}.")
    return sentences
