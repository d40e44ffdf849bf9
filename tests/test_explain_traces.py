"""Explain on real GPU traces (tests/data/hta/: three traces from Holistic Trace Analysis'
repository, with HTA 0.5.0's own figures for them in hta_figures.json, written by
benchmarks/hta_cross_check.py), the Tensor Core kernel families on real names, `explain --trace` on
one and two traces from the CLI and in its report, and a CUDA trace without GPU events."""
import gzip
import json
import os

import pytest

from amp_bench.analysis.explain import gpu_trace
from amp_bench.analysis.explain.categories import classify_kernel, kernel_kind
from amp_bench.analysis.explain.events import CPU_CATS, GPU_CATS, NoGpuActivity, load_trace, nest_events, step_windows
from amp_bench.analysis.explain.kernels import NO_TENSOR_CORE, TENSOR_CORE, UNKNOWN, gemm_dims, tensor_core_use
from amp_bench.analysis.explain.trace import read_profile
from conftest import FIXTURES, ROOT, amp_bench_cli

HTA = ROOT / "tests" / "data" / "hta"
HTA_FIGURES = json.loads((HTA / "hta_figures.json").read_text())
KERNELS = json.loads((FIXTURES / "kernel_names.json").read_text())["kernels"]


@pytest.mark.parametrize("trace",
                         ["a100_alexnet.json.gz", "a100_nccl_sampled_rank0.json.gz", "inference_rank_1.json.gz"])
def test_gpu_totals_agree_with_hta_within_one_percent_and_idle_within_five(trace):
    """HTA's "X overlapping Y" rows count toward every kind they name (the rows of a kind sum to that
    kind's merged busy time), which is what the reader's kinds_ms holds."""
    hta = HTA_FIGURES[trace]["hta"]
    profile = read_profile(HTA / trace, "cuda")
    for kind, theirs in hta["kinds_ms"].items():
        assert profile.kinds_ms[kind] == pytest.approx(theirs, rel=0.01, abs=1e-3), kind
    rows = hta["rows_ms"]
    assert sum(v for k, v in rows.items() if "COMMUNICATION" in k.split(" overlapping ")) == \
        pytest.approx(hta["kinds_ms"]["communication"])
    assert profile.gpu_idle_ms == pytest.approx(hta["idle_ms"], rel=0.05)
    assert profile.gpu_events == hta["events"]  # the same kernels, memcpys and memsets counted


def test_on_microsecond_kernels_hta_counts_the_same_events_at_whole_microseconds():
    """The MI250 toy trace's 16 GPU events last 1-38 us; HTA stores whole microseconds, so its totals
    are 9-16% below the trace's own durations while the events counted are the same (docs/explain.md)."""
    hta = HTA_FIGURES["mi250_minitoy.json.gz"]["hta"]
    profile = read_profile(HTA / "mi250_minitoy.json.gz", "cuda")
    assert profile.gpu_events == hta["events"] == 16
    assert profile.gpu_idle_ms == pytest.approx(hta["idle_ms"], rel=0.05)
    assert all(profile.kinds_ms[k] >= hta["kinds_ms"][k] for k in ("computation", "memory"))


def _hta_arithmetic(trace: str) -> dict[str, float]:
    """HTA 0.5.0's two integer steps replayed on amp_bench's own selection of a trace's GPU events: each
    event's start rounded up and its end down to a whole microsecond (hta/common/trace_parser.py,
    round_down_time_stamps), then the overlap sweep with every segment's length cut to an integer
    (`.astype(int)` in hta/analyzers/breakdown_analysis.py's kernel breakdown)."""
    import math
    bits = {kind: 1 << i for i, kind in enumerate(("computation", "communication", "memory"))}
    marks = []
    for e, _, _ in _kept(trace):
        bit = bits[kernel_kind(e.get("name", ""))]
        marks += [(math.ceil(float(e["ts"])), bit), (math.floor(float(e["ts"]) + float(e.get("dur", 0))), -bit)]
    marks.sort(key=lambda m: m[0])
    totals, running = dict.fromkeys(bits, 0), 0
    for (time, bit), (after, _) in zip(marks, marks[1:] + [(None, 0)], strict=True):
        running += bit
        if after is not None and running > 0:
            for kind, kind_bit in bits.items():
                totals[kind] += int(after - time) if running & kind_bit else 0
    return {kind: us / 1e3 for kind, us in totals.items()}


@pytest.mark.parametrize("trace",
                         ["mi250_minitoy.json.gz", "a100_nccl_sampled_rank0.json.gz", "inference_rank_1.json.gz"])
def test_where_hta_differs_its_integer_microseconds_are_the_whole_difference(trace):
    """amp_bench's events with HTA's rounding give HTA's printed kinds to the microsecond (the MI250 trace:
    0.096 and 0.035 ms against amp_bench's 0.111 and 0.038), so the difference is HTA's arithmetic, not
    the events counted (docs/explain.md, "Side by side with HTA")."""
    replayed = _hta_arithmetic(trace)
    for kind, printed in HTA_FIGURES[trace]["hta"]["kinds_ms"].items():
        assert replayed[kind] == pytest.approx(printed, abs=5e-4), kind


def _kept(trace):
    events = [e for e in load_trace(HTA / trace)["traceEvents"] if e.get("ph") == "X" and "ts" in e]
    nodes = nest_events([e for e in events if e.get("cat") in CPU_CATS])
    return gpu_trace._select([e for e in events if e.get("cat") in GPU_CATS], gpu_trace._launches(events),
                             step_windows(nodes))


def test_nccl_and_memcpy_under_optimizer_step_stay_themselves_and_fbgemm_is_no_gemm():
    kept = _kept("a100_nccl_sampled_rank0.json.gz")
    in_step = [(e, launch) for e, launch, _ in kept
               if launch is not None and any(a.name.startswith("Optimizer.") for a in launch.ancestors())]
    nccl = [e for e, launch in in_step if kernel_kind(e["name"]) == "communication"]
    assert nccl and all(gpu_trace._category(e, launch) == "communication" for e, launch in in_step if e in nccl)
    assert sum(e["dur"] for e in nccl) / 195327 == pytest.approx(0.218, abs=0.001)  # the 21.8%
    assert any(gpu_trace._category(e, launch) == "optimizer" for e, launch in in_step)  # its compute kernels
    fbgemm = [e["name"] for e, _, _ in kept if "fbgemm" in e["name"].lower() or "split_embedding" in e["name"]]
    assert fbgemm and not [n for n in fbgemm if classify_kernel(n) == "gemm"]


def test_amd_tensile_gemms_are_gemms_on_matrix_cores():
    profile = read_profile(HTA / "mi250_minitoy.json.gz")
    assert profile.device_type == "cuda" and profile.categories_ms["gemm"] > 0 and profile.categories_ms["other"] == 0
    assert profile.tensor_cores["share"] == 1.0  # Cijk_..._MI16x16x1_...: MFMA


# real names, each from the public trace named (kernel_names.json's sources, HTA's tests/data, nanochat)
@pytest.mark.parametrize("name, use", [
    ("volta_sgemm_64x64_nt", NO_TENSOR_CORE),  # HTA trace_diff/test (V100)
    ("cudnn_infer_volta_scudnn_128x64_relu_medium_nn_v1", NO_TENSOR_CORE),  # HTA (V100)
    ("void wgrad_alg0_engine<float, 128, 6, 7, 3, 3, 5, false, 512>(int)", NO_TENSOR_CORE),  # HTA (V100)
    ("volta_fp16_s884gemm_fp16_128x128_ldg8_f2f_tn", TENSOR_CORE),  # Volta HMMA (fastai/imagenet-fast fp16)
    ("ampere_sgemm_32x32_sliced1x4_tn", NO_TENSOR_CORE),  # HTA critical_path/alexnet (A100)
    ("ampere_gcgemm_64x64_nt", NO_TENSOR_CORE),  # HTA alexnet: FFT convolution's complex GEMM
    ("void fft2d_c2r_32x32<float, false, false, 0u, false, false>(float*)", NO_TENSOR_CORE),  # HTA alexnet
    ("sm80_xmma_fprop_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x128x16_stage4_warpsize2x2x1"
     "_g1_tensor16x8x8_execute_kernel__5x_cudnn", TENSOR_CORE),  # HTA alexnet (A100 TF32)
    ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x64_32x6_nt_align1>(x)", TENSOR_CORE),  # HTA trace_filter
    ("ampere_bf16_s16816gemm_bf16_256x128_ldg8_f2f_stages_32x3_nn", TENSOR_CORE),  # karpathy/nanochat PR #105
    ("void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align8>(x)", TENSOR_CORE),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel"
     "__5x_cublas", TENSOR_CORE),  # AMD-AGI/TraceLens H100
    ("void pytorch_flash::flash_fwd_kernel<pytorch_flash::Flash_fwd_kernel_traits<64, 128, 128, 4> >(x)", TENSOR_CORE),
    ("Cijk_Alik_Bljk_SB_Bias_AS_SAV_UserArgs_MT64x16x32_MI16x16x1_SN_LDSB0_AFC1", TENSOR_CORE),  # HTA amd_trace
    ("Cijk_Ailk_Bljk_SB_MT64x64x8_SE_K1", NO_TENSOR_CORE),  # Tensile without MFMA
    ("triton_tem_fused_mm_3", UNKNOWN), ("void splitKreduce_kernel<32, 16, int, float>(x)", UNKNOWN),
])
def test_tensor_core_families(name, use):
    assert tensor_core_use(name) == use


@pytest.mark.parametrize("gpu, low, high", [("v100", 0.0, 0.0), ("h100", 0.9, 1.0), ("a100", 0.5, 1.0)])
def test_tensor_core_share_on_the_fixtures_real_kernels(gpu, low, high):
    """V100 traces ran FP32 (SIMT sgemm / scudnn: 0%); the H100 one bf16 (sm90_xmma, flash, s16816)."""
    times = {"tc": 0.0, "all": 0.0}
    for k in KERNELS:
        if k["gpu"] == gpu and classify_kernel(k["name"]) in ("gemm", "conv"):
            times["all"] += k["weight_us"]
            times["tc"] += k["weight_us"] if tensor_core_use(k["name"]) == TENSOR_CORE else 0.0
    assert times["all"] > 0 and low <= times["tc"] / times["all"] <= high


def test_kernels_off_tensor_cores_are_joined_with_their_shapes_alignment():
    assert gemm_dims("aten::mm", [[64, 30], [30, 96]]) == {"K": 30, "N": 96}
    assert gemm_dims("aten::convolution", [[8, 3, 32, 32], [64, 3, 7, 7], [], [], [], [], [], [], []]) == \
        {"in_channels/group": 3, "out_channels": 64}
    summary = {"share": 0.5, "tensor_core_ms": 1.0, "no_tensor_core_ms": 1.0, "unknown_ms": 0.0,
               "off": [("ampere_sgemm_128x128_tn", 1.0, "aten::bmm", [[4, 64, 30], [4, 30, 96]])]}
    from amp_bench.analysis.explain.kernels import describe
    text = describe(summary, eligible=True)["summary"]
    assert "eligible but not on them: ampere_sgemm_128x128_tn 1.00 ms (aten::bmm K=30 N=96; misaligned: K=30)" in text


def _cuda_trace_without_gpu_events():
    return {"traceEvents": [
        {"ph": "X", "cat": "user_annotation", "name": "amp_bench::step", "pid": 1, "tid": 1, "ts": 0, "dur": 1000},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10, "dur": 50},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 20, "dur": 5,
         "args": {"correlation": 7}}]}


def test_a_cuda_trace_without_gpu_events_is_unavailable_never_idle(tmp_path):
    """CUPTI recorded nothing (Nsight Systems holds it, or kineto#1554)."""
    from amp_bench.analysis.explain.judge import explain_row
    with pytest.raises(NoGpuActivity):
        read_profile(_cuda_trace_without_gpu_events(), "cuda")
    (tmp_path / "traces").mkdir()
    with gzip.open(tmp_path / "traces" / "c.json.gz", "wt") as fh:
        json.dump(_cuda_trace_without_gpu_events(), fh)
    (tmp_path / "traces" / "c.layers.json").write_text("[]")
    cols = explain_row({"status": "ok", "device": "cuda:0", "precision": "amp_bf16", "explain_status": "captured",
                        "explain_trace": "traces/c.json.gz", "step_time_ms_median": 1.0}, tmp_path)
    assert cols["explain_status"] == "unavailable" and "no kernel, memcpy or memset" in cols["explain_reason"]
    assert "kineto#1554" in cols["explain_reason"] and cols["explain_host_ms"] is None


def test_cupti_teardown_is_off_before_the_first_profiler_session(monkeypatch):
    """kineto#1554: the throwaway session must not tear CUPTI down under the real one."""
    import torch

    from amp_bench.measure.telemetry import profile
    monkeypatch.delenv("TEARDOWN_CUPTI", raising=False)
    seen = []

    class FakeSession:
        def __init__(self, *args, **kwargs):
            seen.append(os.environ.get("TEARDOWN_CUPTI"))

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False
    monkeypatch.setattr(torch.profiler, "profile", FakeSession)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    profile.warm_cuda_profiler()
    assert seen == ["0"]
    monkeypatch.setenv("TEARDOWN_CUPTI", "1")  # a user's own setting is kept
    profile.warm_cuda_profiler()
    assert seen[-1] == "1"


def _cli(*args):
    return amp_bench_cli("explain", *args, env={"COLUMNS": "200"})


def test_explain_one_trace_and_two_from_the_cli_and_in_the_report(tmp_path):
    one = _cli("--trace", HTA / "a100_alexnet.json.gz", "--reports-dir", tmp_path)
    assert one.returncode == 0, one.stderr
    assert "NVIDIA A100-PG509-200" in one.stdout and "on Tensor Cores 23%" in one.stdout
    two = _cli("--trace", HTA / "a100_alexnet.json.gz", "--trace", HTA / "a100_nccl_sampled_rank0.json.gz",
               "--modes", "fp32,amp_bf16", "--reports-dir", tmp_path)
    assert two.returncode == 0, two.stderr
    assert "a100_nccl_sampled_rank0 against a100_alexnet (they differ in" in two.stdout.replace("\n", " ")
    page = next(tmp_path.glob("explain-a100_alexnet-vs-a100_nccl_sampled_rank0-*.html")).read_text()
    md = next(tmp_path.glob("explain-a100_alexnet-vs-a100_nccl_sampled_rank0-*.md")).read_text()
    for text in (page, md):
        assert "Tensor Core share of GEMM+conv" in text
        assert "communication ms" in text and "against a100_alexnet" in text
    # never a guessed peak: each side's own GPU prices its side, and here neither is in the table
    assert "no dense FP32 peak for 'NVIDIA A100-PG509-200' (a100_alexnet) in the spec table" in md
    unnamed = _cli("--trace", HTA / "a100_nccl_sampled_rank0.json.gz", "--trace", HTA / "a100_alexnet.json.gz",
                   "--modes", "fp32,amp_bf16", "--no-report")
    assert "a100_nccl_sampled_rank0 names no GPU (no deviceProperties): no peak rate, so no ceiling" in \
        unnamed.stdout.replace("\n", " ")


@pytest.mark.parametrize("content, says", [
    (None, "no such file"), (b"not json at all", "not a readable JSON trace"),
    (b'{"schemaVersion": 1}', "not a Chrome / Kineto trace")])
def test_bad_trace_input_is_one_line_naming_the_file(tmp_path, content, says):
    path = tmp_path / "x.json"
    if content is not None:
        path.write_bytes(content)
    proc = _cli("--trace", path, "--no-report")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr + proc.stdout
    assert f"{path}: {says}" in proc.stderr + proc.stdout


def test_onednn_kernels_are_read_from_its_verbose_lines():
    """Lines as oneDNN 3.12 (torch 2.14) printed them on this project's EPYC, amp_bf16 and fp32."""
    from amp_bench.analysis.explain import onednn
    lines = [
        "onednn_verbose,v1,primitive,exec,cpu,convolution,jit_bf16:avx512_core_bf16,forward_training,src:bf16:a:"
        "blocked:abcd::f0 "
        "wei:bf16:ap:blocked:AcdB16a2b::f0,attr-scratchpad:user,alg:convolution_direct,mb8_ic3oc16,10.0",
        "onednn_verbose,v1,primitive,exec,cpu,matmul,brg_matmul:avx512_core_bf16,undef,src:bf16::blocked:ab::f0,"
        "attr-scratchpad:user,,8x14400:14400x64,5.0",
        "onednn_verbose,v1,primitive,exec,cpu,convolution,x64:gemm:jit,backward_weights,src:bf16:a:blocked:abcd::f0,"
        "attr-scratchpad:user,,mb16,5.0",
        "onednn_verbose,v1,primitive,exec,cpu,reorder,jit:uni,undef,src:f32::blocked:abcd::f0,attr-scratchpad:user,,16,3.0",
        "onednn_verbose,v1,info,cpu,isa:Intel AVX-512 with Intel DL Boost and bfloat16 support",
    ]
    records = onednn.parse(lines)
    assert [r["kind"] for r in records] == ["convolution", "matmul", "convolution", "reorder"]
    said = onednn.describe(records)
    assert said["share"] == pytest.approx(15 / 20)  # reorders are not conv/matmul; gemm:jit names no ISA
    assert "AVX512-BF16/FP16 75%" in said["summary"] and "ISA not named 25%" in said["summary"]
    assert onednn.unit("jit:avx512_core") == "FP32 vector (AVX-512/AVX2)"
    assert onednn.unit("brgconv:avx512_core_amx") == "AMX"
