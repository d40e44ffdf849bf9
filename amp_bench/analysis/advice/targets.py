"""An advice item's gain on GPUs this machine does not have: a GPU case's step and its variant's (the change
applied: channels_last, a padded vocabulary, the fused optimizer), each recorded on fake tensors
(studies/gpu_advice.py) and priced on a target by predict's fitted pricing; the gain is their ratio.
Torch-free.

The interval: the saving (the case's priced step minus the variant's) off by the fitted pricing's held-out
errors on a recorded step (predict's INTERVALS["recorded"]: a priced time is 0.50-1.85x of the truth), and
never above the whole time of the ops the change acts on (CHANGED: padding cannot save more than the GEMMs'
time). Everything else in the step is priced alike on both sides, so its error cancels in the ratio.
"""
from __future__ import annotations

import pandas as pd

from amp_bench.analysis.advice.rules import TargetGain
from amp_bench.analysis.predict.model import INTERVALS, Predicted

MIN_GAIN = 1.02  # a priced gain under 2% is not told from none: not printed as advice
# the op categories each change reprices (analysis/predict/pricing.py): the NCHW<->NHWC transforms are a
# convolution's, a misaligned GEMM's rate a GEMM's, the update's passes over the parameters the optimizer's
CHANGED = {"channels_last": ("conv",), "pad_dims": ("gemm",), "optimizer_impl": ("optimizer",)}


def target_gain(rule: str, base: Predicted, variant: Predicted, how: str) -> TargetGain:
    """The change's gain on one target from the two priced steps, with its interval."""
    saving = base.step_ms - variant.step_ms
    low_factor, high_factor = INTERVALS["recorded"]
    least, most = sorted((saving * low_factor, saving * high_factor))
    if saving > 0:  # at most the time of the categories the change reprices
        most = min(most, sum(ms for category, (_, ms) in base.categories.items() if category in CHANGED[rule]))
    return TargetGain(step_ms=base.step_ms, predicted_ms=variant.step_ms, low_ms=base.step_ms - most,
                      high_ms=base.step_ms - least, how=how)


def verdict(gain: TargetGain) -> str:
    """'gain' (at least MIN_GAIN), 'none' (within it either way) or 'slower'."""
    ratio = gain.step_ms / gain.predicted_ms
    return "gain" if ratio >= MIN_GAIN else "slower" if ratio <= 1 / MIN_GAIN else "none"


def said(row: dict) -> str:
    """One target's part of an item, from its predicted_advice.csv row: '~1.53x on A100 SXM 80GB (1.24-1.89x)';
    a loss said as one, never as a gain."""
    label, status = row["target_label"], row["status"]
    if status == "gain":
        return f"~{row['gain']:.2f}x on {label} ({row['gain_low']:.2f}-{row['gain_high']:.2f}x)"
    if status == "slower":
        return f"slower on {label} (~{row['gain']:.2f}x: not advised there)"
    if status == "none":
        return f"no gain on {label} (~{row['gain']:.2f}x)"
    return f"not priced on {label} ({row['reason']})"


def _by_item(table: pd.DataFrame) -> dict[tuple, list[dict]]:
    items: dict[tuple, list[dict]] = {}
    for row in table.to_dict("records"):
        items.setdefault((row["case"], row["precision"], row["model"], row["rule"], row["change"]), []).append(row)
    return items


def gpu_lines(table: pd.DataFrame) -> list[str]:
    """The console's "advice on GPUs" lines: per GPU case and change with a gain on some target, its gain on
    each; then, per change, one line naming the cases no target gains on."""
    lines, none = [], {}
    for (case, precision, _, rule, change), rows in _by_item(table).items():
        if any(row["status"] == "gain" for row in rows):
            lines.append(f"{case} {precision}: {change} ({rule}): {', '.join(said(row) for row in rows)}")
        else:
            none.setdefault(rule, {}).setdefault(case, []).append(precision)
    return lines + [f"no gain predicted from {rule} on these GPUs (under {MIN_GAIN - 1:.0%} or not priced): "
                    + "; ".join(f"{case} {', '.join(modes)}" for case, modes in cases.items())
                    for rule, cases in none.items()]


def on_gpus(table: pd.DataFrame, model: str, precision: str, rule: str) -> str:
    """What a CPU case's item would give on the GPUs: the same change of the suite's GPU case of the same model
    and mode ('' where none was priced)."""
    parts = [f"{case}: {', '.join(said(row) for row in rows)}"
             for (case, mode, label, name, _), rows in _by_item(table).items()
             if (label, mode, name) == (model, precision, rule)]
    return f"; on GPUs (predicted for {'; '.join(parts)})" if parts else ""
