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
from dataclasses import dataclass, field

from amp_bench.analysis.advice.evidence import Evidence
from amp_bench.identity import EAGER
from amp_bench.platform.gpu_specs import find
from amp_bench.store.flags import is_true

MIN_SAVING_SHARE = 0.02  # an item that would change the step by under 2% is not listed: it is noise
# The interval's floor, as a share of the step: how far a `run --try` measurement (six lockstep pairs of 5-step
# windows) landed from the truth on the shared 2-core VM, calibrated with SPREAD on 21 measured items
# (docs/advice.md, "Calibration"): the fused optimizer's items, whose change is a few percent of the step,
# measured up to 8% either side of it.
NOISE_SHARE = 0.08


@dataclass(frozen=True)
class TargetGain:
    """What the change should give on another device (a GPU target of `predict`): its predicted step and
    interval there, and how. Rules that price a change per target fill Advice.targets."""
    step_ms: float
    predicted_ms: float
    low_ms: float
    high_ms: float
    how: str = ""


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
    touched_ms: float = 0.0  # the measured step's time the change acts on (the interval is sized on it)
    doubt: str = ""  # a side of the change the rule could not price here: never advice while said
    targets: dict[str, TargetGain] = field(default_factory=dict)  # per other device, where a rule prices it

    @property
    def speedup(self) -> float:
        return self.step_ms / self.predicted_ms

    @property
    def low_speedup(self) -> float:
        return self.step_ms / self.high_ms

    @property
    def high_speedup(self) -> float:
        return self.step_ms / self.low_ms

    @property
    def verdict(self) -> str:
        """advice (its whole interval above 1.0x, both sides priced), uncertain (a gain expected, but its
        interval reaches 1.0x or a side is unpriced: `run --try` it) or slower (expected to lose)."""
        if self.predicted_ms > self.step_ms:
            return "slower"
        return "uncertain" if self.doubt or self.high_ms >= self.step_ms else "advice"

    def reason(self) -> str:
        """Why an item is not advice, in a few words ('' for advice)."""
        if self.verdict == "slower":
            return "expected slower here"
        if self.doubt:
            return self.doubt
        return "" if self.verdict == "advice" else f"its interval reaches {self.low_speedup:.2f}x"

    def figures(self) -> str:
        return (f"expected step ~{self.predicted_ms:.4g} ms from {self.step_ms:.4g} ({self.low_ms:.4g}-"
                f"{self.high_ms:.4g}), {self.speedup:.2f}x ({self.low_speedup:.2f}-{self.high_speedup:.2f}x)")

    def line(self) -> str:
        """The item in one line, for the console and the report: advice as a gain; an uncertain item with
        why and how to settle it; an expected loss never as a gain."""
        if self.verdict == "slower":
            return (f"not advised: {self.change} would be slower here: {self.evidence}; {self.figures()}. "
                    f"How: {self.how}")
        text = f"{self.change}: {self.evidence}; {self.figures()}. How: {self.how}"
        if self.verdict == "uncertain":
            tried = "`run --try` it" if self.variant else "try it by hand"
            return f"uncertain ({self.reason()}: {tried}): {text}"
        return text


def _item(rule: str, seen: Evidence, saving_ms: float, touched_ms: float, spread: float,
          span: tuple[float, float] | None = None, **text) -> Advice | None:
    """An Advice from a saving in profiled-step ms (negative: a loss), scaled to the measured step; None when
    it would change the step too little to matter. Its interval: the saving +- (NOISE_SHARE of the step and
    `spread` of the `touched_ms` the change acts on), or `span` (the saving's own low and high) where the rule
    models it."""
    if abs(seen.share(saving_ms)) < MIN_SAVING_SHARE:
        return None
    noise = NOISE_SHARE * seen.profiled_ms
    low, high = sorted(span) if span else (saving_ms - spread * touched_ms, saving_ms + spread * touched_ms)
    low, high = low - noise, high + noise
    step = seen.step_ms
    return Advice(rule, step_ms=step, predicted_ms=step - seen.measured(saving_ms), low_ms=step - seen.measured(high),
                  high_ms=step - seen.measured(low), touched_ms=seen.measured(touched_ms), **text)


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


# Each rule's interval: the share of the time its change acts on that the measured step may land either side of
# the prediction beyond NOISE_SHARE. channels_last and optimizer_impl were calibrated on measured items so that
# at least 85% fell inside (benchmarks/advice_calibrate.py: 0.08 and 0.2 held 12 of 12 and 8 of 9), then frozen
# with a margin; pad_dims, casts and fp8 have no measured items yet (a GPU; no try variant) and keep a wide 0.5.
SPREAD = {"pad_dims": 0.5, "channels_last": 0.10, "optimizer_impl": 0.25, "casts": 0.5, "fp8": 0.5}


def pad_dims(evidence: Evidence) -> Advice | None:
    """GEMMs whose dimensions are not multiples of 8 (16 for fp8) run on slow kernels on Tensor Core GPUs.
    Sources: NVIDIA's Matrix Multiplication Background guide (multiples of 8 for fp16/bf16, 16 for fp8);
    nanoGPT pads GPT-2's vocabulary 50257 -> 50304 ("~25%" on an A100); pytorch/pytorch#146817 (odd-sized
    bf16 GEMMs up to ~100x slower on CUTLASS `align1` kernels). Both sides: the misaligned GEMMs' time goes,
    and the padded layers' larger GEMMs run in its place, priced from the shape probe where it timed them padded
    on this GPU (their time as measured, padded over as they are), else at the efficiency (FLOPs per ms) the same
    step's aligned GEMMs reached."""
    multiple = 16 if evidence.precision == "fp8" else 8
    slow = {name: ms for name, ms in evidence.kernels_ms.items() if ALIGN_KERNEL.search(name)}
    layers = misaligned_layers(evidence, multiple)
    gemm_ms, slow_ms = evidence.categories_ms.get("gemm", 0.0), sum(slow.values())
    share = sum(s for _, s, _ in layers)
    if evidence.device_type != "cuda" or not slow or not layers or not 0 < share < 1 or slow_ms >= gemm_ms:
        return None  # no evidence that alignment cost anything here (a CPU's kernels care little)
    probed = evidence.probed("pad_dims")
    if probed is not None and probed.now_ms():
        padded = slow_ms * probed.changed_ms() / probed.now_ms()
        how = (f"the shape probe timed {probed.coverage()} as they are and padded on this GPU: "
               f"{probed.now_ms():.1f} -> {probed.changed_ms():.1f} ms; the misaligned GEMMs' {slow_ms:.1f} ms "
               f"scaled by it: ~{padded:.1f} ms")
    else:
        padded = share / (1 - share) * (gemm_ms - slow_ms)
        how = (f"at the efficiency this step's aligned GEMMs reached ({gemm_ms - slow_ms:.1f} ms for "
               f"{1 - share:.0%} of the FLOPs) they would take ~{padded:.1f} ms")
    label, _, dims = max(layers, key=lambda item: item[1])
    change, variant = _pad_change(label, dims, evidence, multiple)
    names = ", ".join(sorted(slow, key=lambda n: -slow[n])[:2])
    return _item("pad_dims", evidence, slow_ms - padded, slow_ms, SPREAD["pad_dims"], change=change, variant=variant,
                 evidence=(f"{label} holds {share:.0%} of the GEMM FLOPs; {len(slow)} misaligned-kernel GEMMs took "
                           f"{slow_ms:.1f} ms of the {evidence.profiled_ms:.1f} ms step "
                           f"({evidence.share(slow_ms):.0%}): {names[:160]}"),
                 how=f"{how} (+-{SPREAD['pad_dims']:.0%} of the misaligned GEMMs' time)",
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

IN_STEP_KINDS = ("conv", "norm")  # probed kinds whose whole category the profile times (the probe's scale)
LAYOUT_SOURCE = "PyTorch channels_last tutorial; NVIDIA DL performance guide (NHWC); timm (layout 1.47x)"
LAYOUT_CHANGE = "train in channels_last (model and batch in torch.channels_last)"


def channels_last(evidence: Evidence) -> Advice | None:
    """A CNN in NCHW: a GPU's Tensor Core convolutions and a CPU's oneDNN convolutions want NHWC or a blocked
    layout, so each convolution's activations are reordered in and out (CPU: oneDNN's verbose step; GPU:
    nchwToNhwc / nhwcToNchw kernels). But NHWC has its own costs: a convolution whose channel counts fit
    oneDNN's blocked layout better than NHWC, depthwise convolutions, norms and pooling with other kernels. Both
    sides come from the shape probe: every distinct 4-D layer of the step timed forward and backward in NCHW
    and in channels_last on this device (one its budget left untimed at its kind's timed rate and ratio); their
    change, scaled to the step by what the profile's convolutions and norms took over what the probe's did (a
    layer timed alone runs on warm caches). Without a probe the
    removal alone is priced and the item stays uncertain. Sources: PyTorch's "Channels Last Memory Format"
    tutorial; NVIDIA's Deep Learning Performance guide (NHWC for Tensor Core convolutions); timm's training
    benchmarks (ResNet-50 AMP, layout alone 1.47x: huggingface/pytorch-image-models, results/benchmark-train-amp-*)."""
    conv_ms = evidence.categories_ms.get("conv", 0.0)
    if is_true(evidence.case.get("channels_last")) or evidence.share(conv_ms) < 0.10:
        return None
    probed = evidence.probed("channels_last")
    if probed is None:
        return _layout_removed_only(evidence, conv_ms)
    in_step = sum(evidence.categories_ms.get(kind, 0.0) for kind in IN_STEP_KINDS)
    (probe_now, probe_changed), probe_in_step = probed.priced(), probed.priced(IN_STEP_KINDS)[0]
    scale = in_step / probe_in_step if probe_in_step else 1.0
    now, changed = probe_now * scale, probe_changed * scale
    by_kind = {kind: probed.priced((kind,)) for kind in {s.kind for s in probed.shapes}}
    per_kind = ", ".join(f"{k} {a:.0f}->{b:.0f}" for k, (a, b) in sorted(by_kind.items(), key=lambda i: -i[1][0])[:5])
    spread = SPREAD["channels_last"]
    return _item("channels_last", evidence, now - changed, max(now, changed), spread, change=LAYOUT_CHANGE,
                 variant={"channels_last": True},
                 evidence=(f"convolutions are {evidence.share(conv_ms):.0%} of the step; the shape probe timed "
                           f"{probed.coverage()} of its 4-D layers forward and backward on this device: "
                           f"{probe_now:.0f} ms a step in NCHW, {probe_changed:.0f} ms in channels_last "
                           f"(ms by kind: {per_kind})"),
                 how=(f"the probed layers' change scaled to the step by its convolutions and norms' profiled time "
                      f"over the probe's (x{scale:.2f}): {now:.1f} -> {changed:.1f} ms (+-{spread:.0%} of it)"),
                 source=LAYOUT_SOURCE)


def _activation_reorders(evidence: Evidence) -> float:
    """oneDNN's reorders of activations between plain NCHW ("abcd") and its blocked layouts, in its verbose
    step: the 4-D tensors whose first dimension is the batch (weights are reordered into blocks either way)."""
    batch = int(float(evidence.case.get("batch_size") or 0))
    return sum(r.ms for r in evidence.reorders
               if "abcd" in r.formats and len(r.shape) == 4 and batch and r.shape[0] == batch)


def _layout_removed_only(evidence: Evidence, conv_ms: float) -> Advice | None:
    """Without the probe: the conversions NHWC removes (a GPU's transpose kernels, a CPU's oneDNN reorders of
    activations), their share of the convolution work times the convolutions' time. What NHWC costs here is
    not measured, so the item is uncertain whatever its interval."""
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
    return _item("channels_last", evidence, saving, conv_ms, SPREAD["channels_last"], change=LAYOUT_CHANGE,
                 variant={"channels_last": True},
                 doubt=f"what NHWC costs is unmeasured: {evidence.unprobed('channels_last')}",
                 evidence=f"convolutions are {evidence.share(conv_ms):.0%} of the step; {seen}",
                 how=f"the conversions gone: ~{saving:.1f} ms of the {conv_ms:.1f} ms of convolutions",
                 source=LAYOUT_SOURCE)


# --------------------------------------------------------------------------- the optimizer's implementation

# Bytes a parameter's update moves, as the predict model prices the ops (analysis/predict/ops.py): foreach
# AdamW reads and writes the state in eight passes (84 B a parameter in fp32), fused in one (28 B); SGD with
# momentum and weight decay four passes (44 B) against one (20 B). A for-loop moves what foreach does, op by op.
FUSED_SHARE = {"adam": 28 / 84, "adamw": 28 / 84, "sgd": 20 / 44}


def optimizer_impl(evidence: Evidence) -> Advice | None:
    """A for-loop or foreach optimizer where a fused one exists: the fused kernel reads and writes each
    parameter's state once, and with GradScaler it needs no host sync per step. Sources: torch.optim's docs
    (implementations: fused is typically fastest); pytorch/pytorch PR #81705 (fused Adam, no GradScaler
    sync); pytorch/pytorch#80167 (the non-fused path syncs every fp16 step). Both sides: the shape probe timed
    one update of the model's parameter shapes in the current implementation and fused on this device, and the
    optimizer's profiled time is scaled by their ratio (the fused kernel's own time is its cost); without a
    probe, by the fused pass's share of the bytes (FUSED_SHARE), which the foreach ops' per-op overhead beats."""
    name, impl = str(evidence.case.get("optimizer") or ""), str(evidence.case.get("optimizer_impl") or "")
    optimizer_ms = evidence.categories_ms.get("optimizer", 0.0)
    if impl not in ("for-loop", "foreach") or name not in FUSED_SHARE or not optimizer_ms:
        return None
    probed = evidence.probed("optimizer_impl")
    if probed is not None and probed.now_ms():
        ratio = probed.changed_ms() / probed.now_ms()
        how = (f"the shape probe's update of the model's parameters took {probed.now_ms():.1f} ms {impl} and "
               f"{probed.changed_ms():.1f} ms fused on this device: the optimizer's time times {ratio:.2f}")
    else:
        ratio = FUSED_SHARE[name]
        how = f"the optimizer's time times the fused pass's share of its bytes ({ratio:.2f})"
    saving, spread = optimizer_ms * (1 - ratio), SPREAD["optimizer_impl"]
    sync = " and GradScaler's per-step host sync" if is_true(evidence.case.get("scaler_host_sync")) else ""
    return _item("optimizer_impl", evidence, saving, optimizer_ms, spread,
                 change=f"use the fused {name} (fused=True)", variant={"optimizer_impl": "fused"},
                 evidence=(f"the {impl} {name} step took {optimizer_ms:.1f} ms ({evidence.share(optimizer_ms):.0%} of "
                           f"the step){sync}"),
                 how=f"{how}: ~{optimizer_ms - saving:.1f} ms (+-{spread:.0%} of the optimizer's time)",
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
    return _item("host_bound", evidence, saving, busy, 0.0, (evidence.profiled_ms - per_sample(high),
                                                           evidence.profiled_ms - per_sample(low)),
                 change=f"double the batch{f' ({batch} -> {2 * batch})' if batch else ''}",
                 variant={"batch_size": 2 * batch} if batch else None,
                 evidence=f"{where}: {host:.1f} ms of the {evidence.profiled_ms:.1f} ms step "
                          f"({evidence.share(host):.0%})",
                 how="per sample, the ops' time twice over (1.0-2.2x) with the host's once: the time per sample "
                     "at the current batch's worth; a throughput gain, the step itself gets longer",
                 source="PyTorch performance tuning guide; Holistic Trace Analysis (idle time)")


# --------------------------------------------------------------------------- avoidable casts

def casts(evidence: Evidence) -> Advice | None:
    """Casts the model's code makes that autocast would not: an fp32 island (activations cast up to fp32 at the
    top of the forward, then back down, by the code or by autocast at the next lower-precision op) and a weight
    cast more than once a step (an autocast region entered per loop iteration, its cache off, or a weight's
    `.to()` inside a loop). Autocast's own casts (inside the op it wraps: each weight once per region, the
    fp32 list's inputs) are its price for fp32 master weights and never advice (analysis/advice/casts.py tells
    them apart by where they sit in the op tree). Both sides: the casts go, forward and their gradients' in
    the backward (their own time in the trace); a re-cast weight is still cast once. The island's ops would run
    in bf16 instead: where bf16 runs natively (a GPU, a CPU with bf16 units) at most their fp32 time and at least
    half of it (half the bytes); where it is emulated (row `emulated`) or unknown (a CPU trace alone) slower by
    an amount not priced, so the item is uncertain. Sources: PyTorch's autocast docs (the op lists, the weight
    cache per region); torch.amp's "Autocasting" notes (regions should wrap the forward and the loss only)."""
    reading = evidence.casts
    if reading is None or not reading.casts:
        return None
    islands, island_ops = _islands(reading)
    recasts = _recasts(reading, evidence.layers)
    saving = sum(c.ms for c in islands) / reading.steps + sum(ms for _, _, _, ms in recasts)
    if not saving:
        return None
    changes, seen, doubt = [], [], ""
    if islands:
        count = sum(1 for c in islands if c.explicit and c.up and not c.backward) / reading.steps
        changes.append("keep the fp32 islands' activations in bf16 (drop the .float() / autocast(enabled=False) "
                       "around them unless they need fp32)")
        seen.append(f"{count:.0f} fp32 island(s) a step: activations cast up and back down, "
                    f"{sum(c.ms for c in islands) / reading.steps:.1f} ms with their gradients' casts, around "
                    f"{island_ops:.1f} ms of ops in fp32")
        emulated = evidence.case.get("emulated")  # a row's typed flag; a trace alone does not say
        native = evidence.device_type == "cuda" or (isinstance(emulated, bool) and not emulated)
        doubt = "" if native else ("bf16 runs emulated on this CPU (or it is not known to run natively): the "
                                   "islands' ops would be slower in bf16 by an amount not priced")
    if recasts:
        changes.append("cast each weight once a step (one autocast region around the forward and the loss, its "
                       "cache on; no .to() of a weight inside a loop)")
        seen.append("weights cast more than once a step: " + "; ".join(
            f"{'x'.join(map(str, shape))} {count:.0f}x for {expected} weight(s)"
            for shape, count, expected, _ in recasts[:3]))
    spread = SPREAD["casts"]
    span = (saving * (1 - spread), saving * (1 + spread) + island_ops / 2)
    return _item("casts", evidence, saving + island_ops / 4, saving + island_ops / 2, 0.0, span,
                 change="; ".join(changes), evidence="; ".join(seen), doubt=doubt,
                 how=(f"the avoidable casts' own time gone, {saving:.1f} ms (+-{spread:.0%}), and the islands' "
                      f"{island_ops:.1f} ms of ops at 0.5-1x of it in bf16"),
                 source="PyTorch autocast docs (op lists, weight cache per region); torch.amp Autocasting notes")


def _islands(reading) -> tuple[list, float]:
    """The casts of every fp32 island (an explicit up-cast of an activation followed, in the same step's forward,
    by a down-cast of one), their gradients' casts back in the backward, and the forward ops between (ms a step)."""
    found, ops_ms = [], 0.0
    activation = (lambda c: c.shape not in reading.weight_shapes and len(c.shape) >= 2)
    for step in sorted({c.step for c in reading.casts}):
        forward = sorted((c for c in reading.casts if c.step == step and not c.backward and activation(c)),
                         key=lambda c: c.start)
        backward = [c for c in reading.casts if c.step == step and c.backward]
        used: set = set()
        for up in (c for c in forward if c.explicit and c.up):
            down = next((c for c in forward if c.start > up.start and c.down and id(c) not in used), None)
            if down is None:
                continue  # up to fp32 for good (the loss's logits): not an island
            used.add(id(down))
            found += [up, down]
            for cast in (up, down):  # each forward cast's gradient is cast back once
                mirror = next((b for b in backward if b.shape == cast.shape and id(b) not in used), None)
                if mirror is not None:
                    used.add(id(mirror))
                    found.append(mirror)
            ops_ms += sum(ms for start, end, ms in reading.ops_ms.get(step, [])
                          if start > up.start and end < down.start)
    return found, ops_ms / reading.steps


def _recasts(reading, layers) -> list[tuple[tuple, float, int, float]]:
    """(weight shape, casts a step, weights of that shape, the extra casts' ms a step with their gradients')
    for each weight shape cast down more often a step than the layers hold such weights (one cast per weight
    per autocast region). Needs the layer records: without them a trace cannot tell twelve layers cast once
    from one cast twelve times."""
    expected: dict = {}
    for layer in layers:
        d = layer.dims
        shapes = ({(d["out"], d["in"]), (d["in"], d["out"])} if layer.kind == "Linear" else
                  {(d["out"], d["in"] // d["groups"], *d["kernel"])})
        for shape in shapes:
            expected[shape] = expected.get(shape, 0) + 1
    found = []
    for shape, weights in expected.items():
        forward = [c for c in reading.casts if c.shape == shape and c.down and not c.backward]
        per_step = len(forward) / reading.steps
        if not forward or per_step < weights + 1:
            continue
        backward = [c for c in reading.casts if c.shape == shape and c.backward]
        each = sum(c.ms for c in forward) / len(forward) + (sum(c.ms for c in backward) / len(backward) if backward
                                                            else 0.0)
        found.append((shape, per_step, weights, (per_step - weights) * each))
    return sorted(found, key=lambda item: -item[3])


# --------------------------------------------------------------------------- fp8 against bf16

# torchao's float8 training microbenchmarks (its float8 README: a linear's forward and backward, tensorwise
# scaling, compiled, on an H100): float8 over bf16 was 0.8x at M, K, N = 1024, 2048, 1024 and 1.39x at
# 4096, 8192, 16384. Between them the gain is taken log-linear in M*K*N, and held at the ends outside them.
FP8_ANCHORS = ((1024 * 2048 * 1024, 0.80), (4096 * 8192 * 16384, 1.39))
FP8_MIN_CAPABILITY = (8, 9)  # FP8 Tensor Cores: Ada and Hopper


def fp8_gain(m: int, k: int, n: int) -> float:
    """float8's speedup over bf16 for one linear layer's GEMMs of M x K x N, on torchao's anchors."""
    (x0, y0), (x1, y1) = FP8_ANCHORS
    t = (math.log(max(m * k * n, 1)) - math.log(x0)) / (math.log(x1) - math.log(x0))
    return y0 + min(1.0, max(0.0, t)) * (y1 - y0)


def fp8(evidence: Evidence) -> Advice | None:
    """fp8 (torchao float8 linears) against this bf16 step, from its linear layers' GEMM shapes: each layer
    float8 converts (both dimensions multiples of 16) gains fp8_gain of its time, which is its FLOP share of
    the step's aligned GEMM time; a small GEMM loses (float8's scaling and casts cost more than its faster
    matmul saves). Silent on a CPU (no FP8 matmul units) and below compute capability 8.9. float8 is fast only
    compiled, and the anchors are compiled: on an eager step the item is uncertain (compile the bf16 step
    first). Source: torchao's float8 README (microbenchmarks)."""
    spec = find(evidence.device_name) if evidence.device_type == "cuda" else None
    linears = [layer for layer in evidence.layers if layer.kind == "Linear"]
    if evidence.precision != "amp_bf16" or spec is None or tuple(spec.capability) < FP8_MIN_CAPABILITY or not linears:
        return None
    slow_ms = sum(ms for name, ms in evidence.kernels_ms.items() if ALIGN_KERNEL.search(name))
    aligned = [layer for layer in linears if not any(v % 8 for v in layer.checked().values())]
    flops = sum(layer.flops() for layer in aligned)
    aligned_ms = max(evidence.categories_ms.get("gemm", 0.0) - slow_ms, 0.0)
    converted = [layer for layer in aligned if not any(v % 16 for v in layer.checked().values())]
    if not converted or not flops or not aligned_ms:
        return None
    times = [aligned_ms * layer.flops() / flops for layer in converted]
    gains = [fp8_gain(layer.dims["rows"], layer.dims["in"], layer.dims["out"]) for layer in converted]
    saving = sum(ms * (1 - 1 / gain) for ms, gain in zip(times, gains, strict=True))
    touched = sum(times)
    kept = [layer.label() for layer in linears if layer not in converted]
    compiled = (evidence.case.get("compile_mode") or EAGER) != EAGER
    return _item("fp8", evidence, saving, touched, SPREAD["fp8"], change="train the linear layers in fp8 (torchao "
                 "float8, tensorwise; precision fp8)", variant={"precision": "fp8"} if compiled else None,
                 doubt="" if compiled else "this step is eager and float8 is fast only compiled: compile the bf16 "
                                           "step first, then try fp8 against it",
                 evidence=(f"{len(converted)} of {len(linears)} linear layers would train in float8, {touched:.1f} ms "
                           f"of GEMMs; per-layer gains {min(gains):.2f}-{max(gains):.2f}x"
                           + (f"; stays bf16 (not multiples of 16): {', '.join(kept[:2])}" if kept else "")),
                 how=(f"each converted layer's FLOP share of the aligned GEMMs' {aligned_ms:.1f} ms over its gain "
                      f"on torchao's anchors (log-linear in M*K*N): {touched:.1f} -> {touched - saving:.1f} ms "
                      f"(+-{SPREAD['fp8']:.0%} of it)"),
                 source="torchao float8 README (0.8x at 1024x2048x1024, 1.39x at 4096x8192x16384)")


# --------------------------------------------------------------------------- what is by design

def intrinsic(evidence: Evidence) -> list[str]:
    """What a reader might take for advice but is by design: said, never advised away."""
    notes = []
    softmax = sum(ms for name, ms in evidence.kernels_ms.items() if "SoftMax" in name or "softmax" in name)
    if softmax and evidence.precision.startswith("amp_") and evidence.share(softmax) >= MIN_SAVING_SHARE:
        notes.append(f"the loss's softmax ({softmax:.1f} ms, {evidence.share(softmax):.0%} of the step) runs in fp32 "
                     "under autocast by design (autocast_mode.cpp's fp32 list): not advice")
    reading = evidence.casts
    avoidable = {id(c) for c in _islands(reading)[0]} if reading else set()
    recast = {shape for shape, *_ in _recasts(reading, evidence.layers)} if reading else set()
    own = [c for c in reading.casts if not c.explicit and id(c) not in avoidable and c.shape not in recast] \
        if reading else []
    own_ms = sum(c.ms for c in own) / reading.steps if reading else 0.0
    if own and evidence.share(own_ms) >= MIN_SAVING_SHARE:
        notes.append(f"autocast's own casts ({len(own) / reading.steps:.0f} a step, {own_ms:.1f} ms, "
                     f"{evidence.share(own_ms):.0%} of the step: each weight once per region, the fp32 list's inputs, "
                     "their gradients back) are its price for fp32 master weights: not advice")
    return notes


RULES = (pad_dims, channels_last, optimizer_impl, host_bound, casts, fp8)


def assess(evidence: Evidence | None) -> list[Advice]:
    """Every item the rules priced for this step, advice or not (Advice.verdict), the largest predicted saving
    first: what `run --try` may measure."""
    if evidence is None or not evidence.profiled_ms:
        return []
    return sorted([advice for rule in RULES if (advice := rule(evidence)) is not None], key=lambda a: a.predicted_ms)


def advise(evidence: Evidence | None) -> list[Advice]:
    """The items that are advice: a gain whose whole interval lies above 1.0x with both sides priced."""
    return [item for item in assess(evidence) if item.verdict == "advice"]
