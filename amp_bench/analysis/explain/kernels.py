"""Which GEMM / convolution / attention kernels ran on Tensor Cores (AMD: Matrix Cores), by name;
torch-free.

Why by hand: no library says it. DLProf (discontinued) did; Nsight Compute reads the tensor pipe's
counters, which a torch.profiler trace does not carry; Holistic Trace Analysis knows no precision.
The vendor libraries name their kernels after the instruction they are built on, so the name
tells, family by family (first matching rule wins; each rule names where its names were seen):

Tensor Cores
- Volta HMMA 8x8x4: `h884` / `s884` (`volta_fp16_s884gemm_fp16_128x128_ldg8_f2f_tn`; fastai/imagenet-fast
  fp16/README.md checks Tensor Core use with `grep fp16_s884` on nvprof's output)
- Turing / Ampere mma.sync shapes: `1688`, `16816`, `161616`, `i8816`, `i16832` (`cutlass_80_tensorop_
  s1688gemm_*` and `sm80_xmma_*_tf32f32_*` in HTA's A100 traces; `ampere_bf16_s16816gemm_bf16_*`,
  karpathy/nanochat PR #105; `cutlass_80_wmma_tensorop_bf16_s161616gemm_*`, AMD-AGI/TraceLens' H100 trace)
- CUTLASS's operator class and NVIDIA's kernel libraries: `tensorop`, `wmma`, `hmma`, `imma`, `xmma`
  (cuDNN / cuBLAS `sm80_xmma_*`, `sm90_xmma_*`), `gmma` / `wgmma` (Hopper warpgroup MMA), CUTLASS 3
  `cutlass3x_sm90_*`, cuBLAS 12's `nvjet_*` (Hopper / Blackwell), any `tf32` kernel (TF32 exists only on
  Tensor Cores)
- attention: FlashAttention (`flash_fwd`, `flash_bwd`, `pytorch_flash::`: fp16 / bf16 only, built on mma),
  memory-efficient attention in 16 bits (`fmha_cutlassF_f16_*`, `fmha_cutlassB_bf16_*`)
- AMD Tensile (`Cijk_*`) with an `_MI<m>x<n>x<k>` field: MFMA Matrix Cores (HTA's MI250 trace:
  `Cijk_Alik_Bljk_SB_Bias_..._MT64x16x32_MI16x16x1_...`)

not on Tensor Cores (FP32 CUDA cores, "SIMT")
- cuBLAS SIMT GEMMs: `sgemm` / `dgemm` / `hgemm` without an MMA shape (`volta_sgemm_64x64_nt`,
  `ampere_sgemm_32x32_sliced1x4_tn` in HTA's V100 and A100 traces), `gcgemm` (complex, FFT convolution),
  `gemv`, CUTLASS `simt`
- cuDNN SIMT convolutions: `scudnn` (`cudnn_infer_volta_scudnn_128x64_relu_medium_nn_v1`),
  `implicit_convolve_sgemm`, `wgrad_alg0_engine`, `dgrad_engine`, `dgrad2d_alg`, Winograd and FFT
  (`winogradForwardData4x4`, `fft2d_c2r_32x32`), depthwise and grouped direct convolutions
- AMD Tensile without `_MI`: vector ALU GEMMs

unknown: everything else (Triton templates, split-K reductions and epilogues, fp32
memory-efficient attention, whose path depends on the GPU), reported as such, never guessed.
"""
from __future__ import annotations

import re

TENSOR_CORE, NO_TENSOR_CORE, UNKNOWN = "tensor_core", "no_tensor_core", "unknown"

_RULES: list[tuple[str, re.Pattern]] = [(use, re.compile(pattern)) for use, pattern in [
    (TENSOR_CORE, r"[hsi]884|1688|16816|161616|i8816|i16832|tensorop|wmma|hmma|imma|xmma|wgmma|gmma|"
                  r"cutlass3x_sm9|cutlass3x_sm10|nvjet|tf32"),
    (TENSOR_CORE, r"flash_fwd|flash_bwd|pytorch_flash|flash::|fmha_cutlass[fb]_(f16|bf16)|^cijk_.*_mi\d+x\d+"),
    (NO_TENSOR_CORE, r"sgemm|dgemm|hgemm|gcgemm|gemv|simt|^cijk_|scudnn|implicit_convolve|wgrad_alg\d|"
                     r"dgrad_engine|dgrad2d_alg|winograd|fft2d|fft_|depthwise|grouped_direct|direct_conv"),
]]


def tensor_core_use(name: str) -> str:
    """TENSOR_CORE, NO_TENSOR_CORE or UNKNOWN for one GEMM / conv / attention kernel's name."""
    low = name.lower()
    return next((use for use, rule in _RULES if rule.search(low)), UNKNOWN)


def tensor_core_summary(kernel_ms: dict[str, float]) -> dict:
    """{kernel name: ms} of one step's (or trace's) GEMM and conv kernels -> the time on Tensor Cores,
    not on them and unknown, the share on them (of all GEMM+conv time), and the largest kernels off them."""
    by_use = {TENSOR_CORE: 0.0, NO_TENSOR_CORE: 0.0, UNKNOWN: 0.0}
    off: dict[str, float] = {}
    for name, ms in kernel_ms.items():
        use = tensor_core_use(name)
        by_use[use] += ms
        if use == NO_TENSOR_CORE:
            off[name] = off.get(name, 0.0) + ms
    total = sum(by_use.values())
    return {"tensor_core_ms": by_use[TENSOR_CORE], "no_tensor_core_ms": by_use[NO_TENSOR_CORE],
            "unknown_ms": by_use[UNKNOWN], "share": by_use[TENSOR_CORE] / total if total else None,
            "off": sorted(off.items(), key=lambda item: -item[1])}


def gemm_dims(op: str, dims) -> dict[str, int] | None:
    """The dimensions Tensor Core alignment is judged on, from an op's recorded input shapes: a GEMM's
    K and N (mm / addmm / bmm / baddbmm), a convolution's input channels per group and output channels."""
    try:
        shapes = [d for d in dims if isinstance(d, list)]
        if op.endswith("convolution") and len(shapes) >= 2 and len(shapes[1]) >= 2:
            return {"in_channels/group": int(shapes[1][1]), "out_channels": int(shapes[1][0])}
        matrices = [d for d in shapes if len(d) >= 2]
        if len(matrices) >= 2:
            return {"K": int(matrices[0][-1]), "N": int(matrices[1][-1])}
    except (TypeError, ValueError):
        return None
    return None


def off_tensor_cores(summary: dict, multiple: int = 8, limit: int = 3) -> list[str]:
    """The largest GEMM/conv kernels not on Tensor Cores, each with its launching op's shape and the
    likely reason: a dimension that is not a multiple of `multiple` (the alignment table's rule)."""
    out = []
    for name, ms, op, dims in summary.get("off", [])[:limit]:
        short = name.split("(")[0].replace("void ", "")[:60]
        checked = gemm_dims(op, dims) if op and dims else None
        if checked is None:
            out.append(f"{short} {ms:.2f} ms (no recorded shape)")
            continue
        bad = [f"{k}={v}" for k, v in checked.items() if v % multiple]
        why = f"misaligned: {', '.join(bad)}" if bad else f"aligned to {multiple}: alignment is not the reason"
        out.append(f"{short} {ms:.2f} ms ({op} {' '.join(f'{k}={v}' for k, v in checked.items())}; {why})")
    return out


def describe(summary: dict | None, eligible: bool, multiple: int = 8) -> dict:
    """{'share', 'summary'} of a CUDA profile's Tensor Core use, for the results row. `eligible`: the
    mode runs its GEMMs in 16 (or 8) bits, so every GEMM/conv kernel could be on Tensor Cores."""
    if not summary or summary.get("share") is None:
        return {"share": None, "summary": "no GEMM or convolution kernels"}
    total = summary["tensor_core_ms"] + summary["no_tensor_core_ms"] + summary["unknown_ms"]
    text = f"on Tensor Cores {summary['share']:.0%} of {total:.2f} ms of GEMM+conv"
    if summary["unknown_ms"]:
        text += f" ({summary['unknown_ms'] / total:.0%} unknown by name)"
    off = off_tensor_cores(summary, multiple)
    if off:
        text += f"; {'eligible but ' if eligible else ''}not on them: " + "; ".join(off)
    return {"share": summary["share"], "summary": text}


# The number format a GEMM / conv kernel computes in, by name (first match wins): vendor libraries name
# their input type (`ampere_bf16_s16816gemm_bf16`, `sm80_xmma_fprop_..._tf32f32_...`, `volta_fp16_s884gemm`),
# CUTLASS's `s1688gemm` without a 16-bit type is TF32 (HTA's A100 traces), `sgemm` / `scudnn` / FFT and
# Winograd kernels are FP32 on the CUDA cores, and AMD Tensile's `Cijk_..._SB_` is single precision.
_MATH_RULES: list[tuple[str, re.Pattern]] = [(math, re.compile(pattern)) for math, pattern in [
    ("fp8", r"e4m3|e5m2|fp8|float8|f8f8"),
    ("bf16", r"bf16|bfloat16"),
    ("fp16", r"fp16|f16|half|h884|h1688|h16816|hgemm|hcudnn|^cijk_.*_(hb|hhs|hs)_"),
    ("tf32", r"tf32|s1688"),
    ("fp32", r"sgemm|scudnn|gcgemm|fft2d|fft_|winograd|implicit_convolve|<float|^cijk_.*_sb_"),
]]
MATH_LABELS = {"fp32": "FP32", "tf32": "TF32", "fp16": "FP16", "bf16": "BF16", "fp8": "FP8"}
_DTYPE_WORDS = re.compile(r"c10::bfloat16|c10::half|c10::float8_\w+|__nv_bfloat16|__half|bfloat16|float|double|"
                          r"half|bf16|fp16|f16|tf32|fp32|f32|fp8|e4m3|e5m2")


def kernel_math(name: str) -> str | None:
    """'fp32', 'tf32', 'fp16', 'bf16' or 'fp8' for a GEMM / conv kernel's name; None when it does not say."""
    low = name.lower()
    return next((math for math, rule in _MATH_RULES if rule.search(low)), None)


def dominant_math(ms_by_math: dict[str, float]) -> tuple[str | None, float]:
    """(the format most of the named GEMM/conv time ran in, its share of that time); (None, 0) when no
    kernel named its format."""
    total = sum(ms_by_math.values())
    if total <= 0:
        return None, 0.0
    math = max(ms_by_math, key=ms_by_math.get)
    return math, ms_by_math[math] / total


def without_dtypes(name: str) -> str:
    """A kernel's name with its number formats blanked, so the same op in FP32 and in bf16 reads alike."""
    return _DTYPE_WORDS.sub("T", name.lower())
