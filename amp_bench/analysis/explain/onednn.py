"""The CPU's analogue of Tensor Core use: which oneDNN kernels (AMX, AVX512-BF16, plain AVX-512 /
AVX2, reference C) ran the convolutions and matmuls of a step; torch-free.

Why by hand: oneDNN says it only in its verbose log (`onednn_verbose,...,exec,cpu,convolution,
jit_bf16:avx512_core_bf16,...,<ms>`), one line per primitive run. The worker takes one extra step
under `torch.backends.mkldnn.verbose` after the profiled ones (never during them: printing and
timing each primitive would distort the profile) and saves the exec lines beside the trace
(traces/STEM.onednn.txt); this module reads them. What it cannot see: FP32 linear layers on a CPU run
in MKL's sgemm, not oneDNN, so an FP32 step's matmuls are absent (said in the summary).
"""
from __future__ import annotations

import contextlib
from pathlib import Path

from amp_bench.stats import onednn_path as records_path  # noqa: F401 (judge and advice read it here)

ACCELERATED_KINDS = ("convolution", "matmul", "inner_product", "deconvolution")


def parse(lines) -> list[dict]:
    """{kind, impl, ms} of every primitive execution in oneDNN verbose lines (v2 and v3 formats)."""
    out = []
    for line in lines:
        fields = line.strip().split(",")
        if not fields or fields[0] not in ("onednn_verbose", "dnnl_verbose") or "exec" not in fields:
            continue
        i = fields.index("exec")
        with contextlib.suppress(IndexError, ValueError):
            out.append({"kind": fields[i + 2], "impl": fields[i + 3], "ms": float(fields[-1])})
    return out


def read_records(path) -> list[dict] | None:
    path = Path(path)
    return parse(path.read_text(encoding="utf-8", errors="replace").splitlines()) if path.exists() else None


def unit(impl: str) -> str:
    """The execution unit an implementation name says: AMX, AVX512-BF16/FP16, FP32 vector, reference;
    'not named' for one whose name carries no ISA (`x64:gemm:jit`, oneDNN's GEMM-based convolution,
    whose inner GEMM picks its own kernels)."""
    low = impl.lower()
    if "amx" in low:
        return "AMX"
    if "avx512_core_bf16" in low or "avx512_core_fp16" in low or low.startswith(("jit_bf16", "jit_fp16")):
        return "AVX512-BF16/FP16"
    if low.startswith("ref") or ":ref" in low or "simple" in low:
        return "reference C"
    return "FP32 vector (AVX-512/AVX2)" if "avx" in low or "sse" in low else "ISA not named"


def describe(records: list[dict] | None) -> dict:
    """{'share', 'summary'}: the share of conv/matmul primitive time on 16-bit units, and by unit."""
    if records is None:
        return {"share": None, "summary": ""}
    by_unit: dict[str, float] = {}
    for r in records:
        if r["kind"] in ACCELERATED_KINDS:
            by_unit[unit(r["impl"])] = by_unit.get(unit(r["impl"]), 0.0) + r["ms"]
    total = sum(by_unit.values())
    if not total:
        return {"share": None, "summary": "oneDNN ran no convolution or matmul (FP32 linears run in MKL)"}
    fast = by_unit.get("AMX", 0.0) + by_unit.get("AVX512-BF16/FP16", 0.0)
    parts = ", ".join(f"{name} {ms / total:.0%}" for name, ms in sorted(by_unit.items(), key=lambda kv: -kv[1]))
    return {"share": fast / total, "summary": f"oneDNN conv/matmul {total:.1f} ms: {parts} (FP32 linears run in MKL, "
                                             "not seen here)"}
