"""FLOPs counted once per model, batch and layout: the count does not depend on the precision mode (the
counter sees the same matmuls and convolutions under autocast) or the repeat, so a run asks one worker of
each to count (its step after the window, under torch's FlopCounterMode) and gives every other row that
count with its own mode's peak rate. fp8 counts for itself: torchao's float8 linears reach the counter as
scaled matmuls, whose count torch keeps separately from the bf16 GEMMs of the layers fp8 leaves alone."""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from amp_bench import modes
from amp_bench.stats import achieved_rate
from amp_bench.suite import Case

PEAK_COLUMNS = ("peak_tflops", "peak_tflops_source", "peak_tflops_bf16")


def flops_key(case: Case) -> str:
    """What a step's FLOPs depend on: the case's group (model, batch, sizes, layout, processes, compile)."""
    return case.group_id + ("-fp8" if modes.get(case.precision).float8_linear else "")


class FlopCounts:
    """The run's ledger: which FLOP key is counted (or being counted by a worker now), and each case's peaks."""

    def __init__(self):
        self.counted: dict[str, int] = {}
        self.claimed: set[str] = set()
        self.peaks: dict[str, dict] = {}  # case_id -> the peak columns its instrumented repeat gave

    def assign(self, case: Case) -> Case:
        """The case as its worker should run it: counting its FLOPs only when no worker has counted them
        yet or is counting them now (a lockstep set's first member counts for the set)."""
        key = flops_key(case)
        if not case.count_flops:  # asked for no probes (a try run compares throughput only)
            return case
        if key in self.counted or key in self.claimed:
            return dataclasses.replace(case, count_flops=False)
        self.claimed.add(key)
        return dataclasses.replace(case, count_flops=True)

    def carry(self, case: Case, row: Mapping) -> dict:
        """After the worker: keep what it counted (a worker that died without counting frees the key for the
        next one); the FLOPs columns of an ok row without a count of its own: the key's, at its own step time
        and mode's peak (a later repeat: its first repeat's peaks). {} for a row its worker counted for."""
        key = flops_key(case)
        self.claimed.discard(key)
        if row.get("flops_per_step"):
            self.counted[key] = row["flops_per_step"]
        if row.get("peak_tflops_source"):
            self.peaks[case.case_id] = {c: row.get(c) for c in PEAK_COLUMNS}
        if row.get("status") != "ok" or row.get("flops_per_step") or key not in self.counted:
            return {}
        peaks = {} if row.get("peak_tflops_source") else self.peaks.get(case.case_id, {})
        flops, median, rates = self.counted[key], row.get("step_time_ms_median"), {**row, **peaks}
        return {**peaks, "flops_per_step": flops, **achieved_rate(flops, median, rates.get("peak_tflops")),
                "mfu_bf16_basis": achieved_rate(flops, median, rates.get("peak_tflops_bf16"))["mfu"]}
