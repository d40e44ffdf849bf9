"""What a drifting machine allows `compare` to say: how far a run's level wandered while it ran, and
the paired speedups of two runs compared.

Two runs of the same code, minutes apart on a shared VM, differ by whatever the machine did between
them (same-code processes 6-15% apart, the VM 10-40% within an hour). Nothing inside either run
shows that level shift directly, but each run shows how much the machine wandered while it ran: in
every repeat, all the modes of a group ran one after the other or in lockstep, so what they share (the repeat's common
factor, their mean log step time about each mode's own mean) is the machine's level at that moment.
Its spread across the repeats, `wander`, is added to the step-time and throughput intervals: a change
smaller than the machine's own wander is not called a regression; on a drifting VM the step times
then stay "unstable", honestly.

What AMP buys is a ratio of two modes measured in the same repeat, so it survives the drift: the
speedup comparison (metric `speedup`) takes each side's per-repeat paired log ratios
(speedups.paired_log_ratios) and compares their trimmed means with Yuen's t (intervals.TRIM: a pair
that straddled a steal burst does not decide it). A change in the speedup is a finding
even when the step times cannot be compared.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from amp_bench import identity, modes
from amp_bench.analysis.intervals import MIN_REPEATS, judge, trimmed_log_interval, trimmed_log_mean, widen_in_quadrature
from amp_bench.analysis.speedups import clean_pairs, pair_keys, paired_log_ratios

Z95 = 1.959964


def wander(ok: pd.DataFrame) -> float | None:
    """The machine's wander within these runs (log units, one standard deviation): the spread across
    repeats of each group's common factor, pooled over groups (root mean square). None without a group
    of three repeats."""
    if ok.empty or "group_id" not in ok:
        return None
    variances = []
    ok = identity.keyed(ok)
    for _, group in ok.groupby(pair_keys(ok), dropna=False):
        logs = group.pivot_table(index="repeat", columns="precision", values="step_time_ms_median", aggfunc="first")
        logs = np.log(logs.dropna(axis=0, how="any"))
        if len(logs) < MIN_REPEATS:
            continue
        common = (logs - logs.mean()).mean(axis=1)  # each mode about its own mean, then their mean per repeat
        variances.append(float(common.var(ddof=1)))
    return float(np.sqrt(np.mean(variances))) if variances else None


def widen_for_wander(ratio: float, low: float, high: float, base: float | None, cand: float | None
                     ) -> tuple[float, float]:
    """The interval with the two runs' wander added in quadrature (log space): each run's level is
    one draw of its machine's state."""
    return widen_in_quadrature(ratio, low, high, Z95 * float(np.hypot(base or 0.0, cand or 0.0)))


def speedup_results(base_ok: pd.DataFrame, cand_ok: pd.DataFrame, threshold: float, result_type) -> list:
    """One `speedup` result per case (a mode other than the reference) with paired repeats on both
    sides: candidate's speedup over the reference / baseline's, Yuen's t on the two sets of per-repeat
    log ratios (their trimmed means). Lower is worse: AMP buys less. `result_type`: compare.MetricResult."""
    ref = modes.reference()
    base_pairs, cand_pairs = paired_log_ratios(base_ok, ref), paired_log_ratios(cand_ok, ref)
    out = []
    for case_id in dict.fromkeys(base_pairs["case_id"]):
        b = clean_pairs(base_pairs[base_pairs["case_id"] == case_id])
        c = clean_pairs(cand_pairs[cand_pairs["case_id"] == case_id])
        if b.empty or c.empty or (b["precision"] == ref).all():
            continue
        out.append(_speedup_result(case_id, b["_log"].to_numpy(float), c["_log"].to_numpy(float), threshold,
                                   result_type))
    return out


def _speedup_result(case_id: str, base_logs: np.ndarray, cand_logs: np.ndarray, threshold: float, result_type):
    base_speedup, cand_speedup = trimmed_log_mean(base_logs), trimmed_log_mean(cand_logs)
    detail = f"{len(base_logs)} vs {len(cand_logs)} paired repeats over {modes.reference()}"
    if min(len(base_logs), len(cand_logs)) < MIN_REPEATS:
        return result_type(case_id, "speedup", base_speedup, cand_speedup, None, None, None, None, "not enough data",
                           detail + f" (need {MIN_REPEATS} each)")
    ratio, low, high = trimmed_log_interval(base_logs, cand_logs)
    return result_type(case_id, "speedup", base_speedup, cand_speedup, ratio, low, high, None,
                       judge(low, high, threshold, worse_when_higher=False), detail)
