"""The run's `predict:` settings (from the suite file the run kept, RUN_DIR/suite.yaml) and the notes every
prediction prints: what the source is, what "FP32" means on each target, which achievable fractions
are measured; torch-free.

The suite loader validated the block when the run started (suite/fields.py); the spec-table keys are
checked here, where the table is, with the file and field named.
"""
from __future__ import annotations

from pathlib import Path

import yaml

from amp_bench.analysis.predict.scaling import FP32_MEANINGS, TF32_CAPABILITY
from amp_bench.errors import UserError
from amp_bench.platform.gpu_specs import ACHIEVABLE, MEASURED_SOURCE, GpuSpec, achievable, by_key

SUITE_FILE = "suite.yaml"
RESOURCES = ("fp32", "tf32", "fp16", "bf16", "fp8", "bandwidth")
# The default fractions (gpu_specs.ACHIEVABLE) are this project's H200 measurements, a bf16 matmul and a
# device copy: on the H200 those two are measured, not assumed
DEFAULT_MEASURED_ON = {"h200": ("bf16", "bandwidth")}
DEFAULT_TARGETS = ("v100-sxm2", "a100-80gb", "l4", "h100-sxm")  # Volta, Ampere, Ada, Hopper: the generations compared


def suite_settings(source) -> dict:
    """{targets, fp32_as} of the `predict:` block of a suite file, or of the suite a run directory kept ({} when
    it has none)."""
    path = Path(source) if Path(source).is_file() else Path(source) / SUITE_FILE
    if not path.is_file():
        return {}
    try:
        block = (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("predict") or {}
    except (OSError, yaml.YAMLError, AttributeError):
        raise UserError(f"{path}: unreadable suite file") from None
    targets = block.get("targets") or []
    targets = [targets] if isinstance(targets, str) else list(targets)
    known = by_key()
    for i, name in enumerate(targets):
        if name not in known:
            raise UserError(f"{path}: predict.targets[{i}]: unknown GPU {name!r} (known: {', '.join(known)})")
    return {"targets": targets, "fp32_as": block.get("fp32_as")}


def chosen(source, targets=None, fp32_as: str | None = None) -> tuple[list[str], str | None]:
    """The GPUs and the FP32 meaning a prediction of `source` (a suite file or a run directory) uses: those given,
    else its suite's predict: block's, else DEFAULT_TARGETS and amp_bench's own fp32 mode (None)."""
    settings = suite_settings(source)
    fp32 = fp32_as or settings.get("fp32_as")
    return list(targets or settings.get("targets") or DEFAULT_TARGETS), None if fp32 in (None, "mode") else fp32


def fp32_line(spec: GpuSpec, fp32_as: str | None) -> str:
    """What the fp32 mode's FP32 runs as on `spec`."""
    matmul, conv = FP32_MEANINGS[fp32_as or "ieee"]
    if spec.capability < TF32_CAPABILITY:
        return (f"{spec.label} ({spec.capability[0]}.{spec.capability[1]}): no TF32 units, FP32 is IEEE FP32 "
                "whatever the flags")
    used = [what for what, on in (("matmul", matmul), ("convolutions", conv)) if on]
    return (f"{spec.label} ({spec.capability[0]}.{spec.capability[1]}): fp32 runs "
            + (" and ".join(used) + " on TF32 tensor cores" if used else "strict IEEE FP32 (TF32 off)"))


def fractions(spec: GpuSpec) -> tuple[list[str], list[str]]:
    """(the math units and 'bandwidth' whose achievable fraction was measured on this GPU, those whose
    fraction is the assumed default), of the units the GPU has."""
    have = [r for r in RESOURCES if r == "bandwidth" or spec.peak(r)]
    measured = [r for r in have
                if achievable(spec, r)[1] == MEASURED_SOURCE or r in DEFAULT_MEASURED_ON.get(spec.key, ())]
    return measured, [r for r in have if r not in measured]


def fraction_label(spec: GpuSpec) -> str:
    """Which achievable fractions are measured on this GPU and which are assumed, with their values."""
    measured, assumed = fractions(spec)
    parts = [f"measured: {', '.join(f'{r} {achievable(spec, r)[0]:.2f}' for r in measured)}"] if measured else []
    compute = [r for r in assumed if r != "bandwidth"]
    if compute:
        parts.append(f"assumed: {', '.join(compute)} {ACHIEVABLE['compute']:.2f}")
    if "bandwidth" in assumed:
        parts.append(f"{'assumed: ' if not compute else ''}bandwidth {ACHIEVABLE['bandwidth']:.2f}")
    return "; ".join(parts).replace("; bandwidth", ", bandwidth")


def unpriced_lines(result) -> list[str]:
    """One line per case and mode whose op inventory holds ops it could not price (left out of its step)."""
    lines = []
    for case in result.cases:
        for precision, mode in case.modes.items():
            if mode.unpriced:
                named = ", ".join(f"{name} ({n})" for name, n in mode.unpriced.most_common(5))
                lines.append(f"{case.label} {precision}: {sum(mode.unpriced.values())} op calls had no FLOPs or "
                             f"bytes from their recorded inputs and are left out of its predicted step: {named}")
    return lines


def recorded_line() -> str:
    """How a prediction of a recorded step was made and how far it held when scored (fitted.SCORES)."""
    from amp_bench.analysis.predict.fitted import SCORES
    gpu, model = SCORES["gpu"], SCORES["model"]
    return (f"Predicted, nothing measured on a GPU: each case's GPU step (the suite's cuda: block) was recorded on "
            f"fake tensors under CUDA's autocast policy and priced op by op by a model fitted on published AMP "
            f"pairs and this project's H200 reading. Scored with a GPU left out of the fit, its AMP speedups missed "
            f"by {gpu['speedup_median']:.2f}x at the median (worst {gpu['speedup_worst']:.2f}x); with a model left "
            f"out, {model['speedup_median']:.2f}x (worst {model['speedup_worst']:.2f}x); samples/s by "
            f"{gpu['throughput_median']:.2f}x; intervals are the 5th-95th percentile of those errors "
            f"(docs/predict.md)")


def notes(result, targets: list[str], fp32_as: str | None) -> list[str]:
    """The lines printed under the tables: the source's kind, how far to trust the intervals, what FP32
    means on each target, and the GPUs whose achievable fractions were not measured."""
    specs = [by_key()[t] for t in targets]
    lines = []
    if any(not case.is_gpu for case in result.cases):
        lines.append(recorded_line())
    if any(case.is_gpu for case in result.cases):
        lines.append("Intervals are the 10th-90th percentile of the rules' errors on a development set; on the scored "
                     "held-out set the errors spread wider than that, so read them as the least uncertainty "
                     "(docs/predict.md)")
    meaning = "a plain PyTorch script's FP32 (cuDNN TF32 on from Ampere, matmul TF32 off)" if fp32_as else \
        "amp_bench's fp32 mode: strict IEEE FP32 (TF32 off); --fp32-as pytorch-default predicts a plain script's"
    lines.append(f"fp32 is {meaning}: " + "; ".join(fp32_line(s, fp32_as) for s in specs))
    assumed = [f"{s.label} ({', '.join(fractions(s)[1])})" for s in specs if fractions(s)[1]]
    if assumed and any(case.is_gpu for case in result.cases):  # the fractions scale a GPU profile
        lines.append("Achievable fractions assumed, not measured on the GPU itself: " + "; ".join(assumed)
                     + f". {ACHIEVABLE['compute']:.2f} of a compute peak and {ACHIEVABLE['bandwidth']:.2f} of the "
                     "bandwidth stand in (this project's H200 bf16 matmul and device copy); intervals that lean on "
                     "them are wider")
    return lines + unpriced_lines(result)
