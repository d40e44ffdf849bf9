"""The scaling rules: one piece of a profiled step (a kernel, an op's kernels, an op from an inventory,
or a category's lump) from the source GPU to a target GPU, with the rule that decided it; torch-free.

Why by hand: Habitat (Yu et al., ATC'21) and NeuSight (ASPLOS'25) scale per kernel but only in FP32
(their learned parts take the FP32 peak alone), and neither reads amp_bench's breakdown. The rule here
is the minimal one that fits the breakdown (docs/predict.md, "The model, line by line"), explainable line
by line:
- host time (the device idle) is not scaled: a faster GPU waits as long for Python; nor are
  communication (NCCL, gloo) and copies to or from the host: the interconnect and PCIe set their pace;
- a kernel that took under FLOOR_MS on the source is launch-bound: unscaled;
- a kernel with fewer blocks than the source has SMs runs under one wave: more SMs do not help, only
  the clock (Habitat's small-kernel case);
- otherwise, with FLOPs and bytes known, the kernel keeps the efficiency it reached on the source
  against its roofline bound (e = max(F/peak, B/bw) / t) and takes the target's bound over it, the
  peak being that of the math unit it runs on there (FP32 SIMT, TF32, 16-bit or FP8 tensor cores);
- without FLOPs and bytes, GEMM/conv/attention follow the ratio of peaks and the rest the ratio of
  memory bandwidth.
An op inventory (a CPU source, no GPU time) gets the target's derated roofline, at least KERNEL_MIN_MS
per kernel: there is no efficiency to keep, so its interval is wider.
"""
from __future__ import annotations

from dataclasses import dataclass

from amp_bench.platform.gpu_specs import GpuSpec, achievable

FLOOR_MS = 0.010  # ~10 us, one op's launch (model.DISPATCH_MS, docs/sources.md): kernels under it are launch-bound
# The shortest a kernel takes, for pricing an inventory: 3-5 us, the 5th percentile of kernel times in
# Holistic Trace Analysis's public A100 traces (tests/data: critical_path/alexnet, timeline_analysis).
KERNEL_MIN_MS = 0.004
COMPUTE_CATEGORIES = ("gemm", "conv", "attention")
HOST = "host"
HOST_COPY = "host copy"  # a memcpy to or from the host: PCIe's pace, inside the device's busy time
UNSCALED = (HOST, "communication", HOST_COPY)  # not the GPU's to speed up: the host, the interconnect, PCIe
TF32_CAPABILITY = (8, 0)
# What "FP32" means for (matmul, cuDNN convolution) under each setting; TF32 only exists from Ampere on.
FP32_MEANINGS = {
    "ieee": (False, False),  # amp_bench's fp32 mode: strict IEEE FP32 everywhere
    "tf32": (True, True),  # amp_bench's tf32 mode; NVIDIA's NGC containers (their "FP32" tables on A100)
    "pytorch-default": (False, True),  # a plain PyTorch script: matmul.allow_tf32 False, cudnn.allow_tf32 True
}


@dataclass
class Work:
    """One piece of a step to scale. `source_ms` None: an op from an inventory (no GPU time)."""
    label: str
    category: str
    source_ms: float | None
    flops: float = 0.0
    bytes: float = 0.0
    math: str | None = None  # input type of the compute: "fp32", "fp16", "bf16", "fp8"; None: memory-bound
    blocks: int | None = None  # grid size of the kernel, when the trace gives it
    kernels: int = 1
    nchw_bytes: float = 0.0  # an inventory's NCHW convolution: the layout transforms tensor cores add (ops.py)
    misaligned: bool = False  # an inventory's GEMM with dimensions the vectorised Tensor Core kernels refuse (ops.py)


@dataclass(frozen=True)
class Scaled:
    ms: float
    rule: str  # "host", "launch-bound", "one wave", "roofline efficiency", "peak ratio", "bandwidth ratio", ...
    unit: str | None  # the math unit it runs on on the target


def math_unit(work: Work, spec: GpuSpec, tf32: tuple[bool, bool]) -> str | None:
    """The math unit a piece of work runs on on `spec`: its 16-bit/FP8 type as is; FP32 GEMM/attention
    on TF32 tensor cores when matmul TF32 is allowed, FP32 convolution when cuDNN's is, and only from
    compute capability 8.0 (V100 and T4 have no TF32: their FP32 is FP32 whatever the flags say)."""
    if work.category not in COMPUTE_CATEGORIES:
        return None
    math = work.math or "fp32"
    if math != "fp32":
        return math
    allowed = tf32[1] if work.category == "conv" else tf32[0]
    return "tf32" if allowed and spec.capability >= TF32_CAPABILITY else "fp32"


def _peak(spec: GpuSpec, unit: str | None) -> float | None:
    """Derated peak FLOP/s of a unit (None: the GPU has no such unit, e.g. bf16 on a V100)."""
    if unit is None:
        return None
    rate = spec.peak(unit)
    return rate * 1e12 * achievable(spec, unit)[0] if rate else None


def _bandwidth(spec: GpuSpec) -> float:
    return spec.bandwidth_gbs * 1e9 * achievable(spec, "bandwidth")[0]


def roofline_ms(work: Work, spec: GpuSpec, unit: str | None) -> float | None:
    """The derated roofline bound of the work on `spec`, in ms (None when its unit is missing there)."""
    peak = _peak(spec, unit)
    if work.flops and peak is None:
        return None
    compute = work.flops / peak if work.flops else 0.0
    return max(compute, work.bytes / _bandwidth(spec)) * 1e3


def scale(work: Work, source: GpuSpec, target: GpuSpec, source_tf32: tuple[bool, bool],
          target_tf32: tuple[bool, bool]) -> Scaled | None:
    """The work's time on `target`, from its time on `source`; None when the target lacks its unit."""
    unit_dst = math_unit(work, target, target_tf32)
    if work.category in UNSCALED:
        return Scaled(work.source_ms or 0.0, work.category, None)
    if unit_dst is not None and _peak(target, unit_dst) is None:
        return None
    if work.source_ms is None:
        return _from_inventory(work, target, unit_dst)
    if work.source_ms <= FLOOR_MS:
        return Scaled(work.source_ms, "launch-bound", unit_dst)
    if work.blocks is not None and work.blocks < source.sms:
        return Scaled(work.source_ms * source.boost_mhz / target.boost_mhz, "one wave", unit_dst)
    unit_src = math_unit(work, source, source_tf32)
    if work.flops or work.bytes:
        ideal_src, ideal_dst = roofline_ms(work, source, unit_src), roofline_ms(work, target, unit_dst)
        if ideal_src and ideal_dst:  # the efficiency ideal_src / source_ms is kept: an estimate's bias cancels
            efficiency = ideal_src / work.source_ms
            return Scaled(max(ideal_dst / efficiency, min(work.source_ms, FLOOR_MS)), "roofline efficiency", unit_dst)
    if unit_dst is not None and _peak(source, unit_src):
        return Scaled(work.source_ms * _peak(source, unit_src) / _peak(target, unit_dst), "peak ratio", unit_dst)
    return Scaled(work.source_ms * _bandwidth(source) / _bandwidth(target), "bandwidth ratio", unit_dst)


def _from_inventory(work: Work, target: GpuSpec, unit: str | None) -> Scaled:
    """The target's roofline; a convolution on NCHW tensors that runs on tensor cores there (TF32,
    16-bit, FP8) adds its layout transforms, at the target's bandwidth, as the kernels they are."""
    bound = max(roofline_ms(work, target, unit) or 0.0, KERNEL_MIN_MS * work.kernels)
    if work.nchw_bytes and unit not in (None, "fp32"):
        transform = work.nchw_bytes / _bandwidth(target) * 1e3
        return Scaled(bound + max(transform, 2 * KERNEL_MIN_MS), "roofline (inventory) + NCHW transforms", unit)
    return Scaled(bound, "roofline (inventory)", unit)
