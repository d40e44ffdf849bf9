"""Explaining a speedup: kernel and CPU-op classification on real names, the trace reader on
hand-built traces, alignment on given shapes, the decomposition on given tables, and one small real
profile on the CPU (its structure, never its speed)."""
import gzip
import json
import subprocess
import sys
from collections import Counter

import pandas as pd
import pytest

from amp_bench.analysis.explain.alignment import (
    CPU_NOTE,
    Layer,
    alignment_table,
    misaligned_flop_share,
    misaligned_summary,
    read_layers,
)
from amp_bench.analysis.explain.categories import CATEGORIES, classify_kernel, classify_op
from amp_bench.analysis.explain.ceiling import ideal_factors
from amp_bench.analysis.explain.decompose import (
    EXPLAIN_COLUMNS,
    PHASE_COLUMNS,
    decompose,
    explain_results,
    profile_columns,
    unavailable_columns,
)
from amp_bench.analysis.explain.events import Profile
from amp_bench.analysis.explain.sentence import sentence
from amp_bench.analysis.explain.trace import read_profile
from conftest import FIXTURES, ROOT

KERNELS = json.loads((FIXTURES / "kernel_names.json").read_text())["kernels"]
CPU_OPS = json.loads((FIXTURES / "cpu_op_names.json").read_text())["ops"]


@pytest.mark.parametrize("gpu", ["a100", "h100", "v100"])
def test_fixture_kernel_time_lands_in_named_categories(gpu):
    kernels = [k for k in KERNELS if k["gpu"] == gpu]
    assert len(kernels) >= 30 and all(k["source"].count(":") >= 1 and "@" in k["source"] for k in kernels)
    by_category = Counter()
    for k in kernels:
        by_category[classify_kernel(k["name"])] += k["weight_us"]
    total = sum(by_category.values())
    assert 1 - by_category["other"] / total >= 0.95, by_category
    assert len([c for c in by_category if by_category[c] > 0]) >= 5  # not one catch-all bucket


@pytest.mark.parametrize("name, category", [
    # names as they appear in the fixture's public traces (HTA: A100/V100; TraceLens: H100)
    ("volta_sgemm_128x64_nn", "gemm"),
    ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_256x64_16x4_tn_align1>(cutlass_80_tensorop_s1688gemm_"
     "256x64_16x4_tn_align1::Params)", "gemm"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel"
     "__5x_cublas", "gemm"),
    ("void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align8>(x)", "gemm"),
    ("sm80_xmma_fprop_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x128x16_stage4_warpsize"
     "2x2x1_g1_tensor16x8x8_alignc4_execute_kernel_cudnn", "conv"),
    ("sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x64x64_warpgroupsize1x1x1_g1_"
     "execute_segment_k_off_kernel__5x_cudnn", "conv"),
    ("void cudnn::detail::dgrad_engine<float, 512, 6, 5, 3, 3, 3, false>(int)", "conv"),
    ("cudnn_infer_volta_scudnn_128x64_relu_medium_nn_v1", "conv"),
    ("void cudnn::bn_bw_1C11_kernel_new<float, float, float2, 128, true, 1>(float)", "norm"),
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>(int)", "norm"),
    ("void pytorch_flash::flash_fwd_kernel<pytorch_flash::Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, "
     "cutlass::bfloat16_t> >(pytorch_flash::Flash_fwd_params)", "attention"),
    ("fmha_cutlassB_f16_aligned_64x64_k64_sm70", "attention"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::bfloat16_copy_kernel_cuda(at::TensorIteratorBase&)"
     "::{lambda(float)#1}, std::array<char*, 2ul> >(int)", "cast"),
    ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::"
     "{lambda()#3}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1}, std::array<char*, 2ul>, "
     "4, TrivialOffsetCalculator<1, unsigned int>, TrivialOffsetCalculator<1, unsigned int>, "
     "at::native::memory::LoadWithCast<1>, at::native::memory::StoreWithCast<1> >(int)", "cast"),
    ("void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::direct_copy_kernel_"
     "cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#12}::operator()() const::"
     "{lambda(c10::BFloat16)#1}>(at::TensorIteratorBase&)>(int)", "layout"),
    ("void cudnn::ops::nchwToNhwcKernel<float, float, float, false, true, (cudnnKernelDataType_t)2>(x)", "layout"),
    ("Memcpy DtoD (Device -> Device)", "layout"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
     "at::detail::Array<char*, 3> >(int)", "elementwise"),
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<8, c10::BFloat16, float, c10::BFloat16>(x)",
     "reduction"),
    ("void multi_tensor_apply_kernel<TensorListMetadata<4>, AdamFunctor<float>, float>(int)", "optimizer"),
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", "communication"),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "communication"),
    # Inductor's kernel names (torch.compile): the prefix says pointwise, reduction or template
    ("triton_poi_fused_add_relu_0", "elementwise"),
    ("triton_red_fused__log_softmax_1", "reduction"),
    ("triton_per_fused_native_layer_norm_2", "norm"),
    ("triton_tem_fused_mm_3", "gemm"),
    ("volta_fp16_s884gemm_fp16_128x128_ldg8_f2f_tn", "gemm"),
    ("ampere_bf16_s16816gemm_bf16_256x128_ldg8_f2f_stages_32x3_nn", "gemm"),  # karpathy/nanochat PR #105
])
def test_kernel_names_classified(name, category):
    assert classify_kernel(name) == category


@pytest.mark.parametrize("name, types, in_optimizer, category", [
    ("aten::addmm", None, False, "gemm"), ("aten::mm", None, False, "gemm"), ("aten::bmm", None, False, "gemm"),
    ("aten::mkldnn_convolution", None, False, "conv"), ("aten::convolution_backward", None, False, "conv"),
    ("aten::_scaled_dot_product_flash_attention_for_cpu", None, False, "attention"),
    ("aten::threshold_backward", None, False, "elementwise"), ("aten::gelu", None, False, "elementwise"),
    ("aten::native_layer_norm_backward", None, False, "norm"), ("aten::native_batch_norm", None, False, "norm"),
    ("aten::_log_softmax", None, False, "reduction"), ("aten::nll_loss_forward", None, False, "reduction"),
    ("aten::copy_", ["c10::BFloat16", "float", "Scalar"], False, "cast"),
    ("aten::copy_", ["float", "float", "Scalar"], False, "layout"),
    ("aten::copy_", None, False, "layout"),  # no recorded dtypes: a copy is not called a cast
    ("aten::clone", None, False, "layout"), ("aten::_foreach_add_", None, False, "optimizer"),
    ("aten::add_", ["float", "float", "Scalar"], True, "optimizer"),
    ("aten::_amp_foreach_non_finite_check_and_unscale_", None, False, "optimizer"),
    ("autograd::engine::evaluate_function: ConvolutionBackward0", None, False, "conv"),
    ("AddmmBackward0", None, False, "gemm"), ("ToCopyBackward0", None, False, "cast"),
    ("NativeLayerNormBackward0", None, False, "norm"), ("MaxPool2DWithIndicesBackward0", None, False, "reduction"),
    ("torch::autograd::AccumulateGrad", None, False, "elementwise"),
    ("c10d::allreduce_", None, False, "communication"), ("aten::frobnicate", None, False, "other"),
])
def test_cpu_ops_classified(name, types, in_optimizer, category):
    assert classify_op(name, types, in_optimizer) == category


def test_cpu_op_names_from_real_profiles_land_in_named_categories():
    """Self times of every op in real profiles taken on this project's CPU (ResNet-18 and a 2-layer
    GPT-2, fp32 and amp_bf16): at most 5% of the time in 'other', in every profile."""
    for profile in {o["profile"] for o in CPU_OPS}:
        ops = [o for o in CPU_OPS if o["profile"] == profile]
        total = sum(o["self_us"] for o in ops)
        other = sum(o["self_us"] for o in ops if classify_op(o["name"], o["input_types"], o["in_optimizer"]) == "other")
        assert total > 0 and other / total <= 0.05, (profile, other / total)
    casts = [o for o in CPU_OPS if o["name"] == "aten::copy_" and "amp_bf16" in o["profile"]
             and classify_op(o["name"], o["input_types"]) == "cast"]
    assert casts  # autocast's weight casts show as dtype-changing copies


def _x(name, ts, dur, cat="cpu_op", tid=1, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": args}


def test_cpu_trace_self_times_phases_busy_and_host():
    events = [
        _x("amp_bench::step", 0, 100, "user_annotation"),
        _x("amp_bench::forward", 5, 50, "user_annotation"),
        _x("aten::linear", 10, 30), _x("aten::addmm", 12, 26, **{"Input Dims": [[8], [8, 64], [64, 100]]}),
        _x("aten::_to_copy", 40, 10), _x("aten::copy_", 41, 8, **{"Input type": ["c10::BFloat16", "float", "Scalar"]}),
        _x("amp_bench::optimizer", 55, 45, "user_annotation"),
        _x("Optimizer.step#SGD.step", 60, 30, "user_annotation"), _x("aten::_foreach_add_", 62, 18),
        _x("aten::add", 200, 5),  # outside the step: not counted
    ]
    p = read_profile({"traceEvents": events}, "cpu")
    assert p.wall_ms == pytest.approx(0.100)
    assert p.categories_ms["gemm"] == pytest.approx(0.030)  # addmm 26 + linear's own 4, not 56
    assert p.categories_ms["cast"] == pytest.approx(0.010)  # _to_copy follows its dtype-changing copy_
    assert p.categories_ms["optimizer"] == pytest.approx(0.030)  # the region's own Python time too
    assert p.categories_ms["elementwise"] == 0
    assert p.busy_ms == pytest.approx(0.070) and p.host_ms == pytest.approx(0.030)
    assert p.categories_sum_ms == pytest.approx(p.busy_ms)
    assert p.phases_ms["forward"] == pytest.approx(0.040) and p.phases_ms["optimizer"] == pytest.approx(0.030)
    assert p.shapes == [{"op": "aten::addmm", "dims": [[8], [8, 64], [64, 100]], "types": None, "count": 1}]


def test_a_compiled_graph_on_the_cpu_counts_its_generated_kernels():
    """torch.compile on a CPU: Inductor's C++ kernels run as the `## Call CompiledFxGraph` region's own
    time (recorded as an annotation, not an op); its GEMMs stay aten ops."""
    events = [
        _x("amp_bench::step", 0, 100, "user_annotation"),
        _x("Torch-Compiled Region: 0/0", 10, 60), _x("## Call CompiledFxGraph f3x ##", 12, 56, "user_annotation"),
        _x("aten::mm", 20, 30),
    ]
    p = read_profile({"traceEvents": events}, "cpu")
    assert p.categories_ms["gemm"] == pytest.approx(0.030)
    assert p.categories_ms["elementwise"] == pytest.approx(0.026)  # 56 - 30: the fused kernels
    assert p.categories_ms["other"] == pytest.approx(0.004)  # the compiled region's own bookkeeping
    assert p.categories_sum_ms == pytest.approx(p.busy_ms) == pytest.approx(0.060)


def test_gradscaler_work_outside_the_optimizer_region_is_the_scaler_phase():
    events = [
        _x("amp_bench::step", 0, 100, "user_annotation"), _x("amp_bench::backward", 0, 40, "user_annotation"),
        _x("aten::mm", 5, 30), _x("amp_bench::optimizer", 40, 60, "user_annotation"),
        _x("aten::_amp_foreach_non_finite_check_and_unscale_", 42, 8),  # GradScaler.unscale_
        _x("Optimizer.step#SGD.step", 55, 30, "user_annotation"), _x("aten::_foreach_add_", 60, 20),
        _x("aten::_amp_update_scale_", 90, 5),  # GradScaler.update
    ]
    p = read_profile({"traceEvents": events}, "cpu")
    assert p.phases_ms["scaler"] == pytest.approx(0.013) and p.phases_ms["optimizer"] == pytest.approx(0.030)
    assert p.phases_ms["backward"] == pytest.approx(0.030)
    assert p.categories_ms["optimizer"] == pytest.approx(0.043)  # the scaler's ops are optimizer-side work


def test_cuda_trace_kernel_time_idle_and_launch_context():
    copy_name = "void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl<direct_copy_kernel_cuda>>"
    events = [
        _x("amp_bench::step", 0, 1000, "user_annotation"), _x("amp_bench::forward", 0, 400, "user_annotation"),
        _x("aten::copy_", 10, 20, **{"Input type": ["c10::Half", "float", "Scalar"]}),
        _x("cudaLaunchKernel", 12, 5, "cuda_runtime", correlation=1),
        _x("aten::mm", 40, 20), _x("cudaLaunchKernel", 42, 5, "cuda_runtime", correlation=2),
        _x("amp_bench::optimizer", 600, 400, "user_annotation"),
        _x("Optimizer.step#SGD.step", 610, 300, "user_annotation"),
        _x("aten::_foreach_add_", 620, 50), _x("cudaLaunchKernel", 630, 5, "cuda_runtime", correlation=3),
        _x(copy_name, 100, 50, "kernel", tid=7, correlation=1),  # generic copy name, launched by a cast
        _x("ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_nn", 150, 200, "kernel", tid=7, correlation=2),
        _x("ampere_fp16_s16816gemm_fp16_64x64_nn", 300, 100, "kernel", tid=8, correlation=99),  # other stream
        _x("void multi_tensor_apply_kernel<SGD>", 700, 100, "kernel", tid=7, correlation=3),
    ]
    p = read_profile({"traceEvents": events}, "cuda")
    assert p.categories_ms["cast"] == pytest.approx(0.050)
    assert p.categories_ms["gemm"] == pytest.approx(0.250)  # 150-350 and 300-400 on two streams: merged
    assert p.categories_ms["optimizer"] == pytest.approx(0.100)
    assert p.busy_ms == pytest.approx(0.400)  # 100-400 and 700-800
    assert p.categories_sum_ms == pytest.approx(p.busy_ms)  # overlapping streams split, never summed
    assert p.host_ms == pytest.approx(0.600)  # the device idle for the rest of the step
    assert p.kinds_ms == pytest.approx({"computation": 0.400, "communication": 0.0, "memory": 0.0})
    assert p.gpu_span_ms == pytest.approx(0.700) and p.gpu_idle_ms == pytest.approx(0.300)
    assert p.tensor_cores["share"] == pytest.approx(1.0)  # s16816: Ampere's mma shape
    assert any("without a launch" in n for n in p.notes)


def test_alignment_lists_a_100_wide_linear_with_its_flop_share():
    layers = [Layer("encoder.0", "Linear", {"in": 256, "out": 256, "rows": 64}),
              Layer("classifier.3", "Linear", {"in": 256, "out": 100, "rows": 64})]
    table = alignment_table(layers)
    by_module = {r["module"]: r for r in table}
    bad, good = by_module["classifier.3"], by_module["encoder.0"]
    assert bad["layer"] == "classifier.3 Linear(256 -> 100)" and not bad["aligned_8"]
    assert bad["misaligned_8"] == "out_features=100"
    assert bad["flop_share"] == pytest.approx(100 / 356) and good["flop_share"] == pytest.approx(256 / 356)
    assert good["aligned_8"] and good["aligned_16"]
    assert misaligned_flop_share(table) == pytest.approx(100 / 356)
    assert misaligned_summary(table) == "classifier.3 Linear(256 -> 100) 28.1%"
    assert bad["note"] == CPU_NOTE and "Tensor Core" in CPU_NOTE
    conv = Layer("conv1", "Conv2d", {"in": 3, "out": 64, "groups": 1, "kernel": (7, 7), "positions": 8 * 112 * 112})
    assert alignment_table([conv], device_type="cuda")[0]["misaligned_8"] == "in_channels/group=3"
    assert alignment_table([Layer("x", "Linear", {"in": 24, "out": 8, "rows": 8})])[0]["aligned_16"] is False


def test_record_layers_names_modules_from_a_forward_and_the_saved_records_are_judged(tmp_path):
    import torch

    from amp_bench.measure.telemetry.profile import record_layers
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 100))
    with record_layers(model) as records:
        model(torch.ones(4, 64))
    saved = tmp_path / "case.layers.json"
    saved.write_text(json.dumps(records))  # as the worker saves them beside the trace
    table = {r["module"]: r for r in alignment_table(read_layers(saved), step_flops=None)}
    assert table["2"]["layer"] == "2 Linear(256 -> 100)" and not table["2"]["aligned_8"]
    assert table["0"]["aligned_8"] and table["2"]["rows"] == 4
    assert table["2"]["flop_share"] == pytest.approx(256 * 100 / (64 * 256 + 256 * 100))
    assert not model._forward_hooks and not model[0]._forward_hooks  # the hooks are gone


def test_bad_layer_records_are_one_line_naming_the_file_and_field(tmp_path):
    from amp_bench.errors import UserError
    bad = tmp_path / "x.layers.json"
    bad.write_text(json.dumps([{"name": "fc", "kind": "Linear", "dims": {"in": 3, "rows": 2}}]))
    with pytest.raises(UserError, match=r"x\.layers\.json: record 0 \(fc\): dims has no field 'out'"):
        read_layers(bad)
    bad.write_text(json.dumps([{"kind": "Linear"}]))
    with pytest.raises(UserError, match="record 0 has no field 'name'"):
        read_layers(bad)
    bad.write_text("{not json")
    with pytest.raises(UserError, match=r"x\.layers\.json: unreadable layer records"):
        read_layers(bad)


BASE = {"gemm": 40.0, "conv": 18.0, "elementwise": 20.0, "norm": 11.0, "cast": 1.0, "optimizer": 4.0, "other": 2.0,
        "host": 4.0}
MODE = {"gemm": 15.0, "conv": 7.0, "elementwise": 15.0, "norm": 9.0, "cast": 5.0, "optimizer": 4.0, "other": 2.0,
        "host": 4.0}


GPU_IDEAL = ideal_factors("amp_bf16", {"gemm": 16.0, "conv": 16.0, "attention": 16.0}, "A100: 312 / 19.5 TFLOP/s")


def test_decomposition_shares_ceiling_and_sentence():
    d = decompose(BASE, MODE, "amp_bf16", measured_speedup=1.62, ideal=GPU_IDEAL)
    t = d.table.set_index("category")
    assert d.base_total_ms == 100 and d.mode_total_ms == 61
    assert t.loc["gemm", "speedup"] == pytest.approx(40 / 15)
    assert t["saved_share"].sum() == pytest.approx(1.0)
    assert t.loc["cast", "saved_ms"] == pytest.approx(-4.0) and d.cast_added_share == pytest.approx(0.04)
    assert d.accelerated_speedup == pytest.approx(58 / 22) and d.accelerated_share == pytest.approx(0.58)
    # the ideal step: GEMM+conv at 16x, elementwise and norms at 2x, casts gone, the rest unchanged
    assert d.ceiling == pytest.approx(100 / (58 / 16 + 31 / 2 + 0 + 4 + 2 + 4))
    steps = d.waterfall()
    assert steps[0] == ("fp32 step", 100) and steps[-1] == ("amp_bf16 step", 61)
    assert sum(delta for _, delta in steps[1:-1]) == pytest.approx(-39)
    text = sentence(d)
    assert text.startswith("amp_bf16 made GEMM+conv 2.6x faster, but they are 58% of the fp32 step")
    assert "elementwise and norms (31%) gained 1.3x" in text and "casts added 4%" in text
    assert "1.6x measured, of a 3.4x ceiling; held back by: GEMM at 2.67x of 16x" in text
    assert [k for k, _, _ in d.held_back][:1] == ["gemm"]  # the most time lost against its ideal comes first


def test_an_emulated_mode_is_named_so_and_a_slowdown_is_said_as_one():
    """On a CPU without bf16 instructions (allow_emulated), bf16 is slower: the sentence says 'slower'
    and '(emulated)', never '0.1x faster' of a mode the hardware does not have."""
    slow = {k: v * 8 for k, v in MODE.items()}
    ideal = ideal_factors("amp_bf16", {k: 1.0 for k in ("gemm", "conv", "attention")}, "emulated")
    text = sentence(decompose(BASE, slow, "amp_bf16", measured_speedup=0.2, device_type="cpu", emulated=True,
                              ideal=ideal))
    assert text.startswith("amp_bf16 (emulated) made GEMM+conv 3.0x slower, and they are 58% of the fp32 step")
    assert "elementwise and norms (31%) ran 6.2x slower" in text and "5x slower measured" in text
    assert "0." not in text.split(":")[1].split(";")[0]  # no '0.2x measured'
    rows = _rows().assign(emulated=[False, True])
    (_, d), = explain_results(rows)
    assert d.emulated and sentence(d).startswith("amp_bf16 (emulated) made")
    (_, native), = explain_results(_rows())
    assert not native.emulated and "emulated" not in sentence(native)


def test_a_category_within_five_percent_did_not_change():
    same = {**MODE, "gemm": BASE["gemm"], "conv": BASE["conv"], "elementwise": BASE["elementwise"] * 1.02,
            "norm": BASE["norm"]}
    text = sentence(decompose(BASE, same, "amp_bf16", measured_speedup=0.97))
    assert "under amp_bf16 GEMM+conv did not change beyond their noise" in text
    assert "(31%) did not change beyond their noise" in text
    assert "gained 1.0x" not in text and "0.97x measured (no ceiling known)" in text


def test_profile_columns_mark_a_distorted_profile_and_unavailable_rows():
    profile = Profile("cpu", wall_ms=30.0, busy_ms=28.0, categories_ms={c: 0.0 for c in CATEGORIES} | {"gemm": 20.0,
                      "cast": 7.0, "other": 1.0}, phases_ms={"forward": 10.0}, trace_path="t.json.gz")
    cols = profile_columns(profile, measured_ms=19.0, misaligned_share=0.1, misaligned_layers="fc Linear(3 -> 5) 10%")
    assert list(cols) == EXPLAIN_COLUMNS and len(set(EXPLAIN_COLUMNS)) == len(EXPLAIN_COLUMNS)
    assert cols["explain_status"] == "distorted" and "1.6x" in cols["explain_reason"]
    assert cols["explain_cast_share"] == pytest.approx(0.25) and cols["explain_other_share"] == pytest.approx(1 / 28)
    assert cols["explain_host_ms"] == pytest.approx(2.0) and cols["explain_trace"] == "t.json.gz"
    assert profile_columns(profile, measured_ms=25.0)["explain_status"] == "ok"
    gone = unavailable_columns("profiling failed: RuntimeError: boom")
    assert set(gone) == set(EXPLAIN_COLUMNS)
    assert gone["explain_status"] == "unavailable" and gone["explain_gemm_ms"] is None


def _rows(status_amp="ok"):
    rows = []
    for precision, times, median in (("fp32", BASE, 100.0), ("amp_bf16", MODE, 62.0)):
        row = {"model_label": "resnet50", "batch_size": 8, "precision": precision, "status": "ok", "device": "cpu",
               "device_name": "cpu", "compile_mode": "eager", "step_time_ms_median": median,
               "explain_status": status_amp if precision != "fp32" else "ok"}
        row.update({f"explain_{c}_ms": times.get(c, 0.0) for c in CATEGORIES})
        row["explain_host_ms"] = times["host"]
        rows.append(row)
    return pd.DataFrame(rows)


def test_explain_results_pairs_modes_with_fp32_and_uses_the_measured_speedup():
    (label, d), = explain_results(_rows())
    assert label == "resnet50 bs 8" and d.mode == "amp_bf16" and d.measured_speedup == pytest.approx(100 / 62)
    assert "Python and framework time" not in sentence(d)  # host is 4% here: not worth a clause
    assert explain_results(_rows("unavailable")) == []  # no breakdown, no sentence
    two = pd.concat([_rows(), _rows().assign(device_name="NVIDIA H100 80GB HBM3", device="cuda")])
    assert [label for label, _ in explain_results(two)] == ["resnet50 bs 8 on cpu",
                                                            "resnet50 bs 8 on NVIDIA H100 80GB HBM3"]


def test_a_repeat_whose_profile_was_distorted_is_left_out_while_another_is_clean():
    clean = _rows()
    slowed = _rows().assign(step_time_ms_median=[130.0, 62.0])  # a slow fp32 repeat ...
    slowed.loc[slowed["precision"] == "fp32", "explain_conv_ms"] = BASE["conv"] * 3  # ... its profile 3x off
    slowed.loc[slowed["precision"] == "fp32", "explain_status"] = "distorted"
    (_, d), = explain_results(pd.concat([clean, slowed, clean]))
    (_, ref), = explain_results(clean)
    assert not d.distorted and d.base_total_ms == ref.base_total_ms  # the breakdown is the clean repeats'
    assert d.measured_speedup == pytest.approx(100 / 62)  # the measured median is every repeat's
    all_slowed = explain_results(slowed)[0][1]
    assert all_slowed.distorted and all_slowed.base_total_ms > ref.base_total_ms  # nothing clean: said, not hidden


def test_torch_free_modules_do_not_import_torch():
    modules = ["amp_bench.analysis.explain.categories", "amp_bench.analysis.explain.trace",
               "amp_bench.analysis.explain.decompose", "amp_bench.analysis.explain.alignment",
               "amp_bench.analysis.explain.judge", "amp_bench.report.explain_section",
               # the capture side imports torch inside its functions
               "amp_bench.studies.explain_suite", "amp_bench.measure.telemetry.profile"]
    code = ("import json, sys\n" + "".join(f"import {m}\n" for m in modules) +
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] == 'torch')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert json.loads(out.stdout) == []


def test_the_results_columns_are_the_categories_and_both_sides_name_the_same_regions():
    """store/results.py writes the explain_* columns out (store imports nothing above it): they must be
    what the categories and phases make; the capture side and the trace reader share two strings."""
    from amp_bench.analysis.explain import events, judge
    from amp_bench.measure.telemetry import profile
    expected = ([f"explain_{c}_ms" for c in CATEGORIES] +
                ["explain_host_ms", "explain_busy_ms", "explain_profiled_ms", "explain_profiled_vs_measured",
                 "explain_cast_share", "explain_other_share", "explain_misaligned_flop_share",
                 "explain_misaligned_layers"] + [f"explain_phase_{p}_ms" for p in PHASE_COLUMNS] +
                ["explain_trace", "explain_status", "explain_reason", "explain_profiled_steps", "explain_step_samples",
                 "explain_tensor_core_share", "explain_kernel_units"])
    assert expected == EXPLAIN_COLUMNS
    assert (profile.STEP_REGION, profile.PHASE_PREFIX) == (events.STEP_REGION, events.PHASE_PREFIX)
    assert judge.layers_path is profile.layers_path  # one naming of the files beside a trace (stats.py)
    assert str(profile.layers_path("traces/a-r0.json.gz")) == "traces/a-r0.layers.json"
    assert str(profile.onednn_path("b.json")) == "b.onednn.txt"


def _tiny_step(out_features=100):
    import torch

    from amp_bench.measure.step import TrainStep
    from amp_bench.modes import get as get_mode

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                                torch.nn.Flatten(), torch.nn.Linear(8 * 6 * 6, out_features))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, foreach=True)
    step = TrainStep(model, torch.nn.functional.cross_entropy, optimizer, get_mode("fp32"), "cpu")
    x, y = torch.randn(4, 3, 8, 8), torch.randint(0, out_features, (4,))
    step(x, y)
    return model, step, x, y


def test_a_real_cpu_profile_has_every_part(tmp_path):
    """One tiny training step profiled on this CPU (the worker's capture), then judged from the saved
    files as the parent does: structure only, never speed."""
    from amp_bench.analysis.explain.judge import explain_row
    from amp_bench.measure.telemetry.profile import capture

    model, step, x, y = _tiny_step()
    trace = tmp_path / "traces" / "case-r0.json.gz"
    captured = capture(step, x, y, "cpu", str(trace))
    assert captured["explain_status"] == "captured", captured["explain_reason"]
    assert (tmp_path / "traces" / "case-r0.layers.json").exists()
    row = {"status": "ok", "device": "cpu", "precision": "fp32", "step_time_ms_median": None,
           **captured, "explain_trace": "traces/case-r0.json.gz"}  # relative, as launch.run_one makes it
    cols = explain_row(row, tmp_path)
    assert cols["explain_status"] == "ok", cols["explain_reason"]
    assert list(cols) == EXPLAIN_COLUMNS and cols["explain_trace"] == "traces/case-r0.json.gz"
    for category in ("gemm", "conv", "norm", "elementwise", "optimizer"):
        assert cols[f"explain_{category}_ms"] > 0, category
    samples = json.loads(cols["explain_step_samples"])  # every profiled step: categories sum to its busy time
    assert cols["explain_profiled_steps"] == len(samples["wall"]) >= 3
    for i, wall in enumerate(samples["wall"]):
        total, busy = sum(samples[c][i] for c in CATEGORIES), wall - samples["host"][i]
        assert abs(total - busy) <= 0.1 * busy + 1e-3, i
    assert cols["explain_busy_ms"] <= cols["explain_profiled_ms"] + 1e-6
    assert all(cols[f"explain_phase_{p}_ms"] > 0 for p in ("forward", "backward", "optimizer"))
    with gzip.open(trace, "rt") as fh:
        names = {e.get("name") for e in json.load(fh)["traceEvents"]}
    assert {"amp_bench::step", "amp_bench::forward", "amp_bench::backward"} <= names
    # both layers miss a multiple of 8 (3 input channels, 100 outputs): every GEMM/conv FLOP is misaligned
    assert "4 Linear(288 -> 100)" in cols["explain_misaligned_layers"]
    assert "0 Conv2d(3 -> 8, 3x3)" in cols["explain_misaligned_layers"]
    assert cols["explain_misaligned_flop_share"] == pytest.approx(1.0)

    def broken(inputs, target, marks=None):
        raise RuntimeError("boom")
    broken.model = model
    failed = capture(broken, x, y, "cpu", str(tmp_path / "b.json.gz"))
    assert failed["explain_status"] == "unavailable" and "boom" in failed["explain_reason"]
    cols = explain_row({**row, **failed}, tmp_path)  # the measured row stays; the breakdown says why not
    assert cols["explain_status"] == "unavailable"
    assert "boom" in cols["explain_reason"] and cols["explain_gemm_ms"] is None
    assert capture(step, x, y, "cpu", None)["explain_status"] == "unavailable"  # no run directory, no trace


def test_a_damaged_trace_keeps_the_row_and_says_why(tmp_path):
    from amp_bench.analysis.explain.judge import explain_row
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "c.json.gz").write_bytes(b"not gzip")
    cols = explain_row({"status": "ok", "device": "cpu", "precision": "amp_bf16", "explain_status": "captured",
                        "explain_trace": "traces/c.json.gz"}, tmp_path)
    assert cols["explain_status"] == "unavailable" and cols["explain_reason"].startswith("reading the profile failed")
    assert cols["explain_trace"] == "traces/c.json.gz"
    died = explain_row({"status": "timeout", "precision": "fp32"}, tmp_path)
    assert died["explain_status"] == "unavailable" and "timeout" in died["explain_reason"]


def test_the_step_after_the_window_captures_when_asked(tmp_path, monkeypatch):
    from types import SimpleNamespace

    import torch

    from amp_bench.measure import case as measure_case
    from amp_bench.measure.devices import for_device
    from amp_bench.measure.step import TrainStep
    from amp_bench.modes import get as get_mode

    model = torch.nn.Linear(16, 8)
    step = TrainStep(model, torch.nn.functional.mse_loss, torch.optim.SGD(model.parameters(), lr=0.1),
                     get_mode("fp32"), "cpu")
    x, y = torch.ones(4, 16), torch.zeros(4, 8)
    device = SimpleNamespace(type="cpu", name="cpu")
    case = SimpleNamespace(precision="fp32", peak_tflops=None, explain=True, instrument=True, count_flops=True)
    monkeypatch.setenv("AMP_BENCH_EXPLAIN_TRACE", str(tmp_path / "case.json.gz"))  # set by launch.run_one
    out = measure_case._explain(case, device, step, x, y, median_ms=1.0)
    assert out["explain_status"] == "captured" and (tmp_path / "case.json.gz").exists()
    layers = json.loads((tmp_path / "case.layers.json").read_text())
    assert layers[0]["dims"] == {"in": 16, "out": 8, "rows": 4} and layers[0]["calls"] == 1  # one step's calls
    assert "explain_status" not in measure_case._after_window(case, device, for_device("cpu"), step, x, y,
                                                              median_ms=1.0)  # the FLOP/phase step never profiles


def test_unexplained_cases_are_one_line_each_naming_the_repeats_only_when_they_differ():
    from amp_bench.studies.explain_suite import unexplained_lines
    rows = pd.DataFrame([
        {"case_id": "a", "repeat": 0, "status": "unsupported", "reason": "no TF32"},
        {"case_id": "a", "repeat": 1, "status": "unsupported", "reason": "no TF32"},
        {"case_id": "b", "repeat": 0, "status": "ok", "explain_status": "ok"},
        {"case_id": "b", "repeat": 1, "status": "ok", "explain_status": "unavailable", "explain_reason": "trace lost"},
    ])
    assert unexplained_lines(rows) == ["a: unsupported: no TF32", "b (repeat 1): ok: profile unavailable: trace lost"]


def test_ddp_profiled_steps_need_every_rank_ready_and_restore_the_group_timeout(monkeypatch):
    """measure/ddp.synced_steps: a rank not ready means no rank profiles (no collective is left
    half-taken); otherwise the steps run under a cut timeout and the group's own is put back."""
    import torch.distributed as dist

    from amp_bench.measure import ddp

    class FakeRank:
        def __init__(self, ready):
            self.ready = ready

        def all_ready(self, ready, timeout_s):
            assert timeout_s >= 60
            return self.ready
    timeouts, ran = [], []
    monkeypatch.setattr(dist, "set_timeout", lambda t, group=None: timeouts.append(t.total_seconds()))
    out = ddp.synced_steps(FakeRank(False), lambda: ran.append(1) or {}, 3, 10.0)
    assert out["explain_status"] == "unavailable" and not ran and not timeouts
    out = ddp.synced_steps(FakeRank(True), lambda: ran.append(1) or {"explain_status": "captured"}, 3, 30_000.0)
    assert out == {"explain_status": "captured"} and ran == [1]
    assert timeouts == [10 * 4 * 30.0, ddp.GROUP_TIMEOUT_S]  # ten times the steps' time, then the group's own
