"""The gate's "not run: emulated" said with a measured figure: before a run's cases start, each model whose
mode this CPU only emulates (bf16 without AVX512-BF16/AMX, fp16 without AMX-FP16) has its largest layer timed
in fp32 and in that mode, in one worker, within PROBE_BUDGET_S in all (measure/emulation_probe.py); the
unsupported rows then say "bf16 autocast here: its largest convolution (...) ran 37x slower than fp32 ...
(measured)" instead of a figure nothing here measured.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from amp_bench import identity, modes
from amp_bench.platform.device import may_run

PROBE_BUDGET_S = 5.0
PROBE_TIMEOUT_S = 120.0  # the worker's start and the model's fake forward come on top of the timed budget


def _gated(supports: dict, order) -> dict[str, dict]:
    """{group id: {case, precisions, indexes}} of the modes the gate stops as emulated, per model and batch."""
    groups: dict[str, dict] = {}
    for index, case, _ in order:
        support = supports[index]
        if support.emulated and not may_run(support, case.allow_emulated) and modes.get(case.precision).uses_autocast:
            group = groups.setdefault(identity.group_id(case.axes), {"case": case, "precisions": [], "indexes": []})
            group["indexes"].append(index)
            if case.precision not in group["precisions"]:
                group["precisions"].append(case.precision)
    return groups


def sentence(precision: str, reading: dict) -> str:
    """'bf16 autocast here: its largest convolution (layer4.0.conv2, 512->512 3x3 on [8, 512, 7, 7]) ran 37x
    slower than fp32, forward and backward (measured)'."""
    dtype = {"float16": "fp16", "bfloat16": "bf16"}.get(modes.get(precision).autocast_dtype or "", precision)
    return (f"{dtype} autocast here: its largest {reading['kind']} ({reading['layer']}) ran {reading['factor']:.0f}x "
            f"slower than fp32, forward and backward (measured)")


def measured_support(supports: dict, order, server=None, log_dir: Path | None = None) -> dict:
    """`supports` with each gated emulated mode's reason carrying its measured slowdown (the gate's own
    reason where the probe could not measure it)."""
    from amp_bench.launchers.forkserver import launch_spec
    groups = _gated(supports, order)
    if not groups:
        return supports
    budget = PROBE_BUDGET_S / len(groups)
    spec = {"groups": [{"key": key, "case": g["case"].to_json(), "precisions": g["precisions"], "budget_s": budget}
                       for key, g in groups.items()]}
    log = log_dir / "emulation_probe.log" if log_dir else None
    outcome = launch_spec("emulation", spec, log, PROBE_TIMEOUT_S, server=server)
    measured = (outcome.result or {}).get("measured") or {}
    out = dict(supports)
    precisions = {index: case.precision for index, case, _ in order}
    for key, group in groups.items():
        for index in group["indexes"]:
            reading = (measured.get(key) or {}).get(precisions[index])
            if reading:
                out[index] = replace(out[index], reason=f"{out[index].reason}; {sentence(precisions[index], reading)}")
    return out
