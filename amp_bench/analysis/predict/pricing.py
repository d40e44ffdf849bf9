"""The calibrated price of an op inventory (a training step recorded with shapes, no GPU time) on a GPU,
op by op; torch-free (numpy).

    t(op) = max(FLOPs / (peak of its unit x efficiency), bytes x time per byte of its class / bandwidth)
            + a fixed time per kernel,

plus, for a Tensor Core convolution on NCHW tensors, the NCHW<->NHWC transforms of its activations
(cuDNN's Tensor Core kernels are NHWC). What an inventory cannot know is a parameter: how close a GEMM gets
to its unit's peak per dtype, a convolution to a GEMM per layout and dtype, a misaligned GEMM to an aligned
one, Volta's Tensor Cores to later ones, how fast each memory-bound class moves its bytes in eager PyTorch
(one kernel an op), which share of those bytes a stack that fuses elementwise chains still moves (NVIDIA's
NGC containers: the published tables), and a kernel's fixed cost. PARAMETERS names each, with the value it
takes where no data decides it (the prior). The values are fitted by benchmarks/predict_fit.py on what this
project holds (tests/data/predict/amp_pairs.csv, the DLE and Lambda AMP pairs; the H200 reading in
docs/gpu-validation/2026-12-04-h200-5436a8a) and written, with their cross-validated errors, to fitted.py.

Why by hand: Habitat and NeuSight predict from a GPU's own kernel times and in FP32 only; a roofline with
datasheet peaks missed the published AMP speedups by 1.34x at the median (docs/predict.md).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from amp_bench.platform.gpu_specs import MEASURED_FRACTIONS, GpuSpec, measured_fraction

TF32_CAPABILITY = (8, 0)
COMPUTE = ("gemm", "conv", "attention")
BYTE_CLASSES = {"elementwise": "elementwise", "layout": "elementwise", "other": "elementwise", "host": "elementwise",
                "cast": "cast", "reduction": "reduction", "norm": "norm", "optimizer": "optimizer"}
# name: (prior, (low, high), what it is). The prior is the value where no data decides it; the range is
# what physics allows the fit. Efficiencies are fractions of a datasheet dense peak; "time per byte" is
# relative to what standalone copies reached of the chip's datasheet bandwidth (1.0: at that rate).
PARAMETERS = {
    "gemm_fp32": (0.9, (0.3, 1.2), "a GEMM's share of what standalone FP32 GEMMs reached on its chip"),
    "gemm_tf32": (0.8, (0.3, 1.0), "a GEMM's share of the TF32 Tensor Core peak"),
    "gemm_16bit": (0.8, (0.3, 1.0), "a GEMM's share of the FP16/BF16 Tensor Core peak"),
    "conv_tensor_core": (1.0, (0.2, 1.5), "a Tensor Core convolution's efficiency over a GEMM's on its unit (NHWC)"),
    "conv_fp32": (1.0, (0.2, 1.5), "an FP32 (SIMT) convolution's efficiency over an FP32 GEMM's"),
    "conv_bf16": (1.0, (0.2, 1.5), "a bf16 convolution's efficiency over an fp16 one's (cuDNN's kernels differ)"),
    "misaligned": (1.0, (0.02, 1.0), "a GEMM whose dimensions break 16-byte alignment, over an aligned one"),
    "nchw_tf32": (1.0, (0.0, 4.0), "NCHW<->NHWC transforms around a TF32 convolution, in passes over its activations"),
    "nchw_16bit": (1.0, (0.0, 4.0), "the same around a 16-bit convolution"),
    "volta_tensor": (1.0, (0.5, 1.5), "Volta's Tensor Core efficiency over Ampere's"),
    "ada_tensor": (1.0, (0.5, 1.5), "Ada's Tensor Core efficiency over Ampere's"),
    "hopper_tf32": (1.0, (0.5, 1.5), "Hopper's TF32 Tensor Core efficiency over Ampere's"),
    "hopper_16bit": (1.0, (0.5, 1.5), "Hopper's 16-bit and FP8 Tensor Core efficiency over Ampere's"),
    "bytes_elementwise": (1.0, (0.5, 5.0), "time per byte of elementwise, layout and other memory-bound ops"),
    "bytes_cast": (1.0, (0.5, 5.0), "time per byte of dtype casts"),
    "bytes_reduction": (1.0, (0.5, 5.0), "time per byte of reductions, softmax and losses"),
    "bytes_norm": (1.0, (0.5, 5.0), "time per byte of batch and layer norms"),
    "bytes_optimizer": (1.0, (0.5, 5.0), "time per byte of the optimizer's update"),
    "fused_elementwise": (0.5, (0.05, 5.0), "on a fusing stack: time per byte of elementwise, layout and other ops"),
    "fused_cast": (0.5, (0.05, 5.0), "on a fusing stack: time per byte of dtype casts"),
    "fused_reduction": (0.5, (0.05, 5.0), "on a fusing stack: time per byte of reductions, softmax and losses"),
    "fused_norm": (1.0, (0.05, 5.0), "on a fusing stack: time per byte of batch and layer norms"),
    "fused_optimizer": (1.0, (0.05, 5.0), "on a fusing stack: time per byte of the optimizer's update"),
    "kernel_us": (4.0, (1.0, 10.0), "a kernel's fixed time, microseconds (launch tail, under one wave)"),
}
EFFICIENCY_CAP = 0.95  # however its factors combine, no op runs above this share of its unit's datasheet peak
FP8_GEMM = "gemm_16bit"  # no FP8 measurement is in the project: an FP8 GEMM is taken as efficient as a 16-bit one


@dataclass(frozen=True)
class Ops:
    """An inventory as arrays, one entry per distinct op (ops repeated layer after layer are one entry with
    their count), for pricing it on many GPUs and parameter sets at numpy's pace."""
    category: np.ndarray
    math: np.ndarray
    flops: np.ndarray
    bytes: np.ndarray
    kernels: np.ndarray
    nchw_bytes: np.ndarray
    misaligned: np.ndarray
    count: np.ndarray

    @classmethod
    def of(cls, works) -> Ops:
        rows: dict[tuple, int] = {}
        for w in works:
            key = (w.category, w.math or "", w.flops, w.bytes, w.kernels, w.nchw_bytes, bool(w.misaligned))
            rows[key] = rows.get(key, 0) + 1
        columns = list(zip(*rows, strict=True)) if rows else [()] * 7
        return cls(np.array(columns[0], dtype=object), np.array(columns[1], dtype=object),
                   *(np.array(c, float) for c in columns[2:6]), np.array(columns[6], bool),
                   np.array(list(rows.values()), float))


def units(ops: Ops, spec: GpuSpec, tf32: tuple[bool, bool]) -> np.ndarray:
    """The math unit each op runs on on `spec` ('' for memory-bound ops): its 16-bit/FP8 type as is; FP32
    GEMM and attention on TF32 when matmul TF32 is on, FP32 convolution when cuDNN's is, from Ampere on."""
    compute = np.isin(ops.category, COMPUTE) & (ops.flops > 0)
    ampere = spec.capability >= TF32_CAPABILITY
    fp32_as = np.where(ops.category == "conv", "tf32" if tf32[1] and ampere else "fp32",
                       "tf32" if tf32[0] and ampere else "fp32")
    return np.where(compute, np.where(np.isin(ops.math, ("", "fp32")), fp32_as, ops.math), "")


def chip_fraction(spec: GpuSpec, resource: str) -> float:
    """What standalone microbenchmarks reached of this chip's FP32 peak or bandwidth (gpu_specs'
    MEASURED_FRACTIONS); a chip never measured takes the median of those that were."""
    measured = measured_fraction(spec, resource)
    if measured is not None:
        return measured
    return float(np.median([f[resource] for f in MEASURED_FRACTIONS.values() if resource in f]))


def _compute_rate(ops: Ops, unit: np.ndarray, spec: GpuSpec, p: dict) -> np.ndarray:
    """FLOP/s each compute op reaches (inf for memory-bound ops, nan where the GPU lacks the unit)."""
    rate = np.full(len(unit), np.inf)
    for name, efficiency in (("fp32", p["gemm_fp32"] * chip_fraction(spec, "fp32")), ("tf32", p["gemm_tf32"]),
                             ("fp16", p["gemm_16bit"]),
                             ("bf16", p["gemm_16bit"]), ("fp8", p[FP8_GEMM])):
        rate[unit == name] = (spec.peak(name) or np.nan) * 1e12 * efficiency
    tensor_core = np.isin(unit, ("tf32", "fp16", "bf16", "fp8"))
    conv = ops.category == "conv"
    rate = np.where(conv, rate * np.where(tensor_core, p["conv_tensor_core"], p["conv_fp32"]), rate)
    rate = np.where(conv & (unit == "bf16"), rate * p["conv_bf16"], rate)
    rate = np.where(ops.misaligned & tensor_core, rate * p["misaligned"], rate)
    if spec.capability >= (9, 0):
        rate = np.where(unit == "tf32", rate * p["hopper_tf32"], np.where(tensor_core, rate * p["hopper_16bit"], rate))
    elif spec.capability in ((7, 0), (8, 9)):
        rate = np.where(tensor_core, rate * p["volta_tensor" if spec.capability == (7, 0) else "ada_tensor"], rate)
    peaks = np.array([(spec.peak(u) or np.nan) * 1e12 if u else np.inf for u in unit])
    return np.minimum(rate, peaks * EFFICIENCY_CAP)


def op_ms(ops: Ops, spec: GpuSpec, tf32: tuple[bool, bool], p: dict, stack: str = "eager") -> np.ndarray:
    """Each distinct op's time on `spec` in all its calls, ms (nan where the GPU lacks its unit); `tf32`: what
    FP32 matmul and convolution run as there. A convolution's transforms are its recorded NCHW activations."""
    unit = units(ops, spec, tf32)
    rate = _compute_rate(ops, unit, spec, p)
    compute_s = np.where(ops.flops > 0, ops.flops / rate, 0.0)
    prefix = "fused_" if stack == "fused" else "bytes_"
    per_byte = np.full(len(unit), p[prefix + "elementwise"])
    for category, kind in BYTE_CLASSES.items():
        if kind != "elementwise":
            per_byte[ops.category == category] = p[prefix + kind]
    bandwidth = spec.bandwidth_gbs * 1e9 * chip_fraction(spec, "bandwidth")
    seconds = np.maximum(compute_s, ops.bytes * per_byte / bandwidth) + p["kernel_us"] * 1e-6 * ops.kernels
    passes = np.where(unit == "tf32", p["nchw_tf32"], np.where(np.isin(unit, ("fp16", "bf16", "fp8")), p["nchw_16bit"],
                                                               0.0))
    seconds = seconds + np.where(ops.category == "conv", ops.nchw_bytes * passes / bandwidth, 0.0)
    return seconds * ops.count * 1e3
