"""From "why" to "what to change": rules that read one profiled step (evidence.Evidence) and, where they
apply, say what to change, the evidence, the predicted step time and speedup with an interval, how the
prediction was made, and where the rule comes from. Each rule stays silent where it does not apply and
never advises away what is intrinsic (the fp32 softmax in the loss under autocast is by design: said as
such, not advised). Ranked by the predicted saving. Torch-free; docs/advice.md has the rules' scores.

Why by hand: no tool predicts the gain of its advice. NVIDIA's DLProf had an "expert systems" list,
torch-tb-profiler a recommendation panel, Holistic Trace Analysis none; none priced an item, none checked
one by measuring the changed case (what `run --try` does here).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

from amp_bench.analysis.advice.evidence import Evidence
from amp_bench.store.flags import is_true

MIN_SAVING_SHARE = 0.02  # an item that would save under 2% of the step is not advice, it is noise


@dataclass
class Advice:
    rule: str  # its name: what `run --try` takes
    change: str  # what to change, in one line
    evidence: str  # layers, kernels, ms and shares that show it
    step_ms: float  # the measured step
    predicted_ms: float  # the step predicted after the change
    low_ms: float  # the predicted step's interval
    high_ms: float
    how: str  # how the prediction was made
    source: str  # where the rule comes from
    variant: dict | None = None  # the case fields `run --try` changes to apply it; None: nothing to try here

    @property
    def speedup(self) -> float:
        return self.step_ms / self.predicted_ms

    def line(self) -> str:
        """The item in one line, for the console and the report."""
        return (f"{self.change}: {self.evidence}; expected step ~{self.predicted_ms:.4g} ms from {self.step_ms:.4g} "
                f"({self.low_ms:.4g}-{self.high_ms:.4g}), {self.speedup:.2f}x "
                f"({self.step_ms / self.high_ms:.2f}-{self.step_ms / self.low_ms:.2f}x). How: {self.how}")


def _item(rule: str, seen: Evidence, saving_ms: float, interval: tuple[float, float], **text) -> Advice | None:
    """An Advice whose saving (profiled-step ms, with its low and high) is scaled to the measured step;
    None when it would save too little to matter."""
    if seen.share(saving_ms) < MIN_SAVING_SHARE:
        return None
    low, high = sorted(interval)
    step = seen.step_ms
    return Advice(rule, step_ms=step, predicted_ms=step - seen.measured(saving_ms),
                  low_ms=step - seen.measured(high), high_ms=step - seen.measured(low), **text)


def round_up(value: int, multiple: int) -> int:
    return int(math.ceil(value / multiple) * multiple)


# --------------------------------------------------------------------------- misaligned GEMM dimensions

ALIGN_KERNEL = re.compile(r"align[124](?!\d)")  # CUTLASS names its kernels by the operands' alignment in elements


def misaligned_layers(evidence: Evidence, multiple: int) -> list[tuple[str, float, dict]]:
    """(label, share of the step's linear-layer FLOPs, the misaligned dims) of every misaligned linear layer:
    the GEMM time they are priced against is the GEMM category's (convolutions are a category of their own)."""
    linears = [layer for layer in evidence.layers if layer.kind == "Linear"]
    total = sum(layer.flops() for layer in linears)
    if linears and total:
        return [(layer.label(), layer.flops() / total, bad) for layer in linears
                if (bad := {k: v for k, v in layer.checked().items() if v % multiple})]
    if evidence.misaligned:
        return [(label, share, {}) for label, share in evidence.misaligned]
    return evidence.shape_misaligned.get(multiple, [])  # a trace alone: its GEMM ops' recorded shapes


def pad_dims(evidence: Evidence) -> Advice | None:
    """GEMMs whose dimensions are not multiples of 8 (16 for fp8) run on slow kernels on Tensor Core GPUs.
    Sources: NVIDIA's Matrix Multiplication Background guide (multiples of 8 for fp16/bf16, 16 for fp8);
    nanoGPT pads GPT-2's vocabulary 50257 -> 50304 ("~25%" on an A100); pytorch/pytorch#146817 (odd-sized
    bf16 GEMMs up to ~100x slower on CUTLASS `align1` kernels). Priced at the efficiency (FLOPs per ms) the
    same step's aligned GEMMs reached: the misaligned layers' FLOP share over the aligned ones' times the
    aligned GEMMs' ms, between 2/3 and 3/2 of that efficiency."""
    multiple = 16 if evidence.precision == "fp8" else 8
    slow = {name: ms for name, ms in evidence.kernels_ms.items() if ALIGN_KERNEL.search(name)}
    layers = misaligned_layers(evidence, multiple)
    gemm_ms, slow_ms = evidence.categories_ms.get("gemm", 0.0), sum(slow.values())
    share = sum(s for _, s, _ in layers)
    if evidence.device_type != "cuda" or not slow or not layers or not 0 < share < 1 or slow_ms >= gemm_ms:
        return None  # no evidence that alignment cost anything here (a CPU's kernels care little)
    at_aligned = share / (1 - share) * (gemm_ms - slow_ms)
    saving = (slow_ms - at_aligned, slow_ms - at_aligned * 1.5, slow_ms - at_aligned / 1.5)
    label, _, dims = max(layers, key=lambda item: item[1])
    change, variant = _pad_change(label, dims, evidence, multiple)
    names = ", ".join(sorted(slow, key=lambda n: -slow[n])[:2])
    return _item("pad_dims", evidence, saving[0], saving[1:], change=change, variant=variant,
                 evidence=(f"{label} holds {share:.0%} of the GEMM FLOPs; {len(slow)} misaligned-kernel GEMMs took "
                           f"{slow_ms:.1f} ms of the {evidence.profiled_ms:.1f} ms step "
                           f"({evidence.share(slow_ms):.0%}): {names[:160]}"),
                 how=(f"at the efficiency this step's aligned GEMMs reached ({gemm_ms - slow_ms:.1f} ms for "
                      f"{1 - share:.0%} of the FLOPs) they would take ~{at_aligned:.1f} ms (2/3-3/2 of it)"),
                 source="NVIDIA Matrix Multiplication Background (multiples of 8, 16 for fp8); nanoGPT's vocabulary "
                        "50304; pytorch/pytorch#146817")


def _pad_change(label: str, dims: dict, evidence: Evidence, multiple: int) -> tuple[str, dict | None]:
    """What to pad, and the try variant: a transformers model's vocabulary (its largest misaligned
    output), else the layer's misaligned dimensions."""
    out = re.search(r"-> (\d+)\)", label)
    transformers = str(evidence.case.get("model") or "").startswith("transformers")
    if out and int(out.group(1)) % multiple and (transformers or "lm_head" in label):
        vocab = int(out.group(1))
        return (f"pad the vocabulary to a multiple of 64 ({vocab} -> {round_up(vocab, 64)})",
                {"pad_vocab_to_multiple_of": 64} if transformers else None)
    padded = ", ".join(f"{k} {v} -> {round_up(v, multiple)}" for k, v in dims.items()) or "its dimensions"
    return f"pad {label.split(' ')[0]}'s {padded} (multiples of {multiple})", None


# --------------------------------------------------------------------------- channels_last

LAYOUT_RANGE = (0.3, 2.0)  # the saving's interval, from the first scores (docs/advice.md)

def _activation_reorders(evidence: Evidence) -> float:
    """oneDNN's reorders of activations between plain NCHW ("abcd") and its blocked layouts, in its verbose
    step: the 4-D tensors whose first dimension is the batch (weights are reordered into blocks either way)."""
    batch = int(float(evidence.case.get("batch_size") or 0))
    return sum(r.ms for r in evidence.reorders
               if "abcd" in r.formats and len(r.shape) == 4 and batch and r.shape[0] == batch)


def channels_last(evidence: Evidence) -> Advice | None:
    """A CNN in NCHW: a GPU's Tensor Core convolutions and a CPU's oneDNN bf16 convolutions want NHWC, so
    each convolution's activations are reordered in and out (CPU: oneDNN's verbose step shows the reorders;
    GPU: nchwToNhwc / nhwcToNchw kernels). Sources: PyTorch's "Channels Last Memory Format" tutorial;
    NVIDIA's Deep Learning Performance guide (NHWC for Tensor Core convolutions); timm's training benchmarks
    (ResNet-50 AMP, layout alone 1.47x: huggingface/pytorch-image-models, results/benchmark-train-amp-*).
    Priced as the layout conversions gone: their share of the convolution time times the step's convolution
    category. The interval, 0.3-2x of that saving, is what the first scores showed (docs/advice.md: measured
    savings 0.25-2.2x of the predicted ones on six CPU cases): NHWC also moves the batch norms and elementwise
    ops, which this saving does not price."""
    conv_ms = evidence.categories_ms.get("conv", 0.0)
    if is_true(evidence.case.get("channels_last")) or evidence.share(conv_ms) < 0.10:
        return None
    transposes = {n: ms for n, ms in evidence.kernels_ms.items() if re.search(r"nchwToNhwc|nhwcToNchw", n)}
    if transposes:  # a GPU's kernels say it directly
        saving, seen = sum(transposes.values()), f"{len(transposes)} NCHW<->NHWC transpose kernels"
    else:
        reorders = _activation_reorders(evidence)
        total = sum(r.ms for r in evidence.reorders) + evidence.onednn_conv_ms
        if not reorders or not total:
            return None
        saving = reorders / total * conv_ms
        seen = (f"oneDNN reordered activations between NCHW and its blocked layout for {reorders:.0f} ms of its "
                f"{total:.0f} ms of convolution work ({reorders / total:.0%})")
    return _item("channels_last", evidence, saving, (saving * LAYOUT_RANGE[0], saving * LAYOUT_RANGE[1]),
                 change="train in channels_last (model and batch in torch.channels_last)",
                 variant={"channels_last": True},
                 evidence=f"convolutions are {evidence.share(conv_ms):.0%} of the step; {seen}",
                 how=(f"the conversions gone: ~{saving:.1f} ms of the {conv_ms:.1f} ms of convolutions "
                      f"({LAYOUT_RANGE[0]}-{LAYOUT_RANGE[1]}x of it)"),
                 source="PyTorch channels_last tutorial; NVIDIA DL performance guide (NHWC); timm (layout 1.47x)")


# --------------------------------------------------------------------------- the optimizer's implementation

# Bytes a parameter's update moves, as the predict model prices the ops (analysis/predict/ops.py): foreach
# AdamW reads and writes the state in eight passes (84 B a parameter in fp32), fused in one (28 B); SGD with
# momentum and weight decay four passes (44 B) against one (20 B). A for-loop moves what foreach does, op by op.
FUSED_SHARE = {"adam": 28 / 84, "adamw": 28 / 84, "sgd": 20 / 44}
FUSED_RANGE = (0.5, 2.5)  # the saving's interval, from the first scores (docs/advice.md)


def optimizer_impl(evidence: Evidence) -> Advice | None:
    """A for-loop or foreach optimizer where a fused one exists: the fused kernel reads and writes each
    parameter's state once, and with GradScaler it needs no host sync per step. Sources: torch.optim's docs
    (implementations: fused is typically fastest); pytorch/pytorch PR #81705 (fused Adam, no GradScaler
    sync); pytorch/pytorch#80167 (the non-fused path syncs every fp16 step). Priced as the optimizer category
    times the fused pass's share of the bytes (FUSED_SHARE). The interval, 0.5-2.5x of that saving, is what the
    first scores showed (docs/advice.md: measured savings 0.5-2.5x of the predicted on seven CPU cases): a fused
    step also saves the foreach ops' per-op overhead, which the bytes do not price."""
    name, impl = str(evidence.case.get("optimizer") or ""), str(evidence.case.get("optimizer_impl") or "")
    optimizer_ms = evidence.categories_ms.get("optimizer", 0.0)
    if impl not in ("for-loop", "foreach") or name not in FUSED_SHARE or not optimizer_ms:
        return None
    saving = optimizer_ms * (1 - FUSED_SHARE[name])
    sync = " and GradScaler's per-step host sync" if is_true(evidence.case.get("scaler_host_sync")) else ""
    return _item("optimizer_impl", evidence, saving, (saving * FUSED_RANGE[0], saving * FUSED_RANGE[1]),
                 change=f"use the fused {name} (fused=True)", variant={"optimizer_impl": "fused"},
                 evidence=(f"the {impl} {name} step took {optimizer_ms:.1f} ms ({evidence.share(optimizer_ms):.0%} of "
                           f"the step){sync}"),
                 how=(f"the optimizer's time times the fused pass's share of its bytes ({FUSED_SHARE[name]:.2f}): "
                      f"~{optimizer_ms - saving:.1f} ms ({FUSED_RANGE[0]}-{FUSED_RANGE[1]}x of the saving)"),
                 source="torch.optim docs (fused is typically fastest); PR #81705 (fused Adam, no GradScaler sync)")


# --------------------------------------------------------------------------- a host-bound step

HOST_BOUND_SHARE = 0.30
HOST_OPS_SCALING = (1.0, 2.2)  # the ops' time at twice the batch: the interval, from the scores (docs/advice.md)


def host_bound(evidence: Evidence) -> Advice | None:
    """A step that waits on the host (GPU: the device idle; CPU: framework time between ops) for a large share:
    the host's time is paid per step, not per sample, so a larger batch spreads it. Sources: PyTorch's
    performance tuning guide (increase the batch while the device is underused); Holistic Trace Analysis's
    idle-time analysis. Priced per sample at twice the batch: the ops' time doubles while the host's stays;
    interval: the ops' time from 1.0x (an op too small for the batch to matter, its time fixed per call: the
    first scores' tiny GPT-2 on a CPU) to 2.2x (spilled caches)."""
    busy, host = evidence.profiled_ms - evidence.host_ms, evidence.host_ms
    batch = int(float(evidence.case.get("batch_size") or 0))
    if evidence.share(host) < HOST_BOUND_SHARE or busy <= 0 or not evidence.steps_known:
        return None  # (a trace without steps: its idle is the whole trace's, not a step's)

    def per_sample(scale: float) -> float:  # profiled ms per original batch's worth of samples
        return (scale * busy + host) / 2
    saving = evidence.profiled_ms - per_sample(2.0)
    where = "the device sat idle" if evidence.device_type == "cuda" else "framework time between ops"
    low, high = HOST_OPS_SCALING
    return _item("host_bound", evidence, saving, (evidence.profiled_ms - per_sample(high),
                                                  evidence.profiled_ms - per_sample(low)),
                 change=f"double the batch{f' ({batch} -> {2 * batch})' if batch else ''}",
                 variant={"batch_size": 2 * batch} if batch else None,
                 evidence=f"{where}: {host:.1f} ms of the {evidence.profiled_ms:.1f} ms step "
                          f"({evidence.share(host):.0%})",
                 how="per sample, the ops' time twice over (1.0-2.2x) with the host's once: the time per sample "
                     "at the current batch's worth; a throughput gain, the step itself gets longer",
                 source="PyTorch performance tuning guide; Holistic Trace Analysis (idle time)")


# --------------------------------------------------------------------------- what is by design

def intrinsic(evidence: Evidence) -> list[str]:
    """What a reader might take for advice but is by design: said, never advised away."""
    notes = []
    softmax = sum(ms for name, ms in evidence.kernels_ms.items() if "SoftMax" in name or "softmax" in name)
    if softmax and evidence.precision.startswith("amp_") and evidence.share(softmax) >= MIN_SAVING_SHARE:
        notes.append(f"the loss's softmax ({softmax:.1f} ms, {evidence.share(softmax):.0%} of the step) runs in fp32 "
                     "under autocast by design (autocast_mode.cpp's fp32 list): not advice")
    return notes


RULES = (pad_dims, channels_last, optimizer_impl, host_bound)


def advise(evidence: Evidence | None) -> list[Advice]:
    """Every rule that applies, the largest predicted saving first."""
    if evidence is None or not evidence.profiled_ms:
        return []
    return sorted([advice for rule in RULES if (advice := rule(evidence)) is not None], key=lambda a: a.predicted_ms)
