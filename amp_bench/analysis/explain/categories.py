"""What a step's time was spent on, in the categories that explain an AMP speedup; torch-free.

Written by hand because the tools that exist do not answer the question: torch.profiler lists ops
and kernels by name, and Holistic Trace Analysis splits GPU kernels into computation, communication
and memory only (it cannot tell a GEMM from an elementwise kernel or a cast, and it keeps no CPU
rows). AMP speeds up the work Tensor Cores (or AMX / AVX512-BF16) run, GEMMs, convolutions and
attention, and leaves the memory-bound rest (elementwise, norms, reductions, the optimizer) to gain
only from smaller tensors, while adding casts. So the categories are those.

Two classifiers, each an ordered list of rules (first match wins; the order is the documentation):
- `classify_kernel(name)`: a CUDA kernel (or memcpy/memset) name from a profiler trace.
- `classify_op(name, input_types, in_optimizer)`: a CPU aten op, for its self time.

Casts on the GPU (a decision, documented): a copy kernel is a cast only where its name shows the
dtype change: `bfloat16_copy_kernel_cuda`, `float16_copy_kernel_cuda`, `float8_copy_kernel_cuda`,
or a `direct_copy_kernel_cuda` instantiated with `LoadWithCast`/`StoreWithCast`/`FetchAndCast`
(PyTorch's dynamic-casting path, taken only when source and destination dtypes differ). A plain
`direct_copy_kernel_cuda` (including `gpu_kernel_impl_nocast`) is a layout copy: same dtype,
other strides. The trace reader (trace.py) also calls a copy kernel a cast when the CPU op that
launched it is a dtype-changing `aten::_to_copy`/`aten::copy_` (recorded input types), which
catches the older kernel names that hide the cast.
Casts on the CPU: `aten::copy_` whose two tensor inputs have different recorded dtypes is a cast,
the same dtype is a layout copy; `aten::to`/`aten::_to_copy` take their `copy_` child's category
(trace.py), and are casts when they have none; autocast's own `_autocast_to_*` are casts.
torch.compile on a CPU (a decision): the self time of Inductor's `## Call CompiledFxGraph` region is
its generated C++ kernels, fused pointwise/reduction/norm work, counted as elementwise; the GEMMs and
convolutions it calls out to stay aten ops. On a GPU its Triton kernels are named (triton_poi/red/per/tem).
"""
from __future__ import annotations

import re

CATEGORIES = ("gemm", "conv", "attention", "elementwise", "norm", "reduction", "cast", "layout",
              "optimizer", "communication", "other")
ACCELERATED = ("gemm", "conv", "attention")  # what Tensor Cores / AMX run: AMP's target
MEMORY_BOUND = ("elementwise", "norm", "reduction", "layout", "optimizer")
LABELS = {"gemm": "GEMM", "conv": "conv", "attention": "attention", "elementwise": "elementwise", "norm": "norms",
          "reduction": "softmax/loss/reductions", "cast": "casts", "layout": "layout/memory copies",
          "optimizer": "optimizer", "communication": "communication", "other": "other", "host": "host (no op running)"}
HOST = "host"  # wall time of the profiled step with no op / kernel running: computed by trace.py
COMPILED_GRAPH = "## Call CompiledFxGraph"  # torch.compile on a CPU: Inductor's C++ kernels run in this region

_CAST_KERNEL = re.compile(r"bfloat16_copy_kernel|float16_copy_kernel|float8_copy_kernel|half_copy_kernel|"
                          r"direct_copy_kernel.*(loadwithcast|storewithcast|fetchandcast|castandstore)|"
                          r"cast_transpose|\bcast_kernel|quantize_kernel|to_fp8|fp8_cast")

_KERNEL_RULES: list[tuple[str, re.Pattern]] = [(cat, re.compile(pattern)) for cat, pattern in [
    ("communication", r"nccl|rccl|gloo|cross_device_reduce|all_reduce|allreduce|allgather|reduce_scatter"),
    ("layout", r"^(hip)?memcpy|^(hip)?memset|^dma|\[cuda memcpy|\[cuda memset"),
    # FBGEMM's table-batched embeddings, permutes and bucketizing are memory-bound lookups, and its
    # FP8 quantize kernels are casts: 'fbgemm' must never reach the 'gemm' rule
    ("cast", r"fbgemm.*(quantize|_to_fp8|fp8_|float8)"),
    ("layout", r"split_embedding|embedding_codegen|permute_pooled|fbgemm|bounds_check_indices|bucketize|jagged"),
    ("optimizer", r"multi_tensor_apply|adamfunctor|sgdfunctor|fused_adam|fused_sgd|lamb_|_amp_foreach|"
                  r"amp_update_scale|non_finite_check|rowwise_adagrad|adagrad"),
    ("attention", r"flash_fwd|flash_bwd|flash::|flashattn|pytorch_flash|fmha|efficient_attention|mem_eff|"
                  r"attention_kernel|cutlassf_|cutlassb_|sdpa|_attn_fwd|_attn_bwd|flex_attention"),
    ("cast", _CAST_KERNEL.pattern),
    ("norm", r"batch_norm|batchnorm|cudnn::bn_|bn_fw|bn_bw|layer_norm|layernorm|rms_norm|rmsnorm|group_norm|"
             r"groupnorm|welford|gammabetabackward|instance_norm|triton_(red|per)_fused_.*(norm|var_mean)"),
    ("conv", r"fprop|dgrad|wgrad|implicit_convolve|implicitgemmconv|convolution|conv2d|conv3d|conv1d|"
             r"scudnn|hcudnn|convolve|winograd|fft2d|fft_|cask_cudnn|_conv_|depthwise|cudnn::cnn|triton_tem_fused_conv"),
    ("gemm",
     r"(?<!fb)gemm|gemv|^cijk_|xmma|s884|h884|s1688|h1688|s16816|h16816|wmma|tensorop|cublas|nvjet|splitkreduce|"
             r"magma_|epilogue::impl|triton_tem_|_scaled_mm|matmul|sm90_|sm80_|sm100_|cutlass::kernel"),
    ("reduction", r"softmax|nll_loss|cross_entropy|_ce_(fwd|bwd)|reduce_kernel|reduce_by_key|devicereduce|"
                  r"max_pool|avg_pool|adaptive_average|adaptive_max|pool_|triton_red_|triton_per_|"
                  r"sum_functor|meanops|argmax|topk|logsumexp|cumsum|scan"),
    ("layout", r"nchwtonhwc|nhwctonchw|transpose|permute|catarraybatchedcopy|cat_|direct_copy_kernel|"
               r"copy_kernel|index_select|indexselect|gather|scatter|index_elementwise|embedding|fillfunctor|"
               r"fill_kernel|recat|reshape_and_cache|pad_kernel|im2col|col2im|upsample|grid_sampl"),
    ("elementwise", r"elementwise_kernel|triton_poi_|triton__|triton_|distribution_|dropout|act_and_mul|silu|"
                    r"gelu|relu|tanh|sigmoid|rotary|rope|swiglu|where|clamp|functor|_kernel_cuda"),
]]


KINDS = ("computation", "communication", "memory")  # Holistic Trace Analysis' kernel types
_MEMORY_KIND = re.compile(r"^(hip)?memcpy|^(hip)?memset|^dma|\[cuda memcpy|\[cuda memset")


def kernel_kind(name: str) -> str:
    """HTA's split of GPU time: communication (collectives), memory (memcpy/memset) or computation."""
    low = name.lower()
    if _KERNEL_RULES[0][1].search(low):
        return "communication"
    return "memory" if _MEMORY_KIND.search(low) else "computation"


def classify_kernel(name: str) -> str:
    """Category of one CUDA kernel, memcpy or memset by its trace name ('other' when no rule matches)."""
    low = name.lower()
    return next((category for category, rule in _KERNEL_RULES if rule.search(low)), "other")


_OP_SETS: dict[str, set[str]] = {
    "gemm": {"mm", "addmm", "bmm", "baddbmm", "addbmm", "matmul", "linear", "_scaled_mm", "_addmm_activation",
             "mkldnn_linear", "_mkldnn_linear", "mv", "addmv", "dot", "einsum", "_int_mm", "_weight_int8pack_mm",
             "mkldnn_linear_backward_weights", "mkldnn_linear_backward_input", "_linear_backward"},
    "conv": {"convolution", "_convolution", "conv1d", "conv2d", "conv3d", "mkldnn_convolution",
             "convolution_backward", "cudnn_convolution", "_slow_conv2d_forward", "_slow_conv2d_backward",
             "thnn_conv2d", "_nnpack_spatial_convolution", "_conv_depthwise2d", "convolution_overrideable",
             "conv_transpose2d", "mkldnn_convolution_backward", "slow_conv3d_forward"},
    "norm": {"batch_norm", "native_batch_norm", "native_batch_norm_backward", "_batch_norm_impl_index",
             "_batch_norm_impl_index_backward", "layer_norm", "native_layer_norm", "native_layer_norm_backward",
             "group_norm", "native_group_norm", "native_group_norm_backward", "rms_norm", "_fused_rms_norm",
             "_fused_rms_norm_backward", "instance_norm", "cudnn_batch_norm", "cudnn_batch_norm_backward",
             "_native_batch_norm_legit", "_native_batch_norm_legit_no_training", "_batch_norm_with_update",
             "batch_norm_backward", "_batch_norm_no_update", "batch_norm_stats", "batch_norm_elemt"},
    "reduction": {"softmax", "_softmax", "log_softmax", "_log_softmax", "_log_softmax_backward_data",
                  "_softmax_backward_data", "nll_loss", "nll_loss_forward", "nll_loss_backward", "nll_loss_nd",
                  "nll_loss2d_forward", "nll_loss2d_backward", "cross_entropy_loss", "mse_loss", "mse_loss_backward",
                  "binary_cross_entropy", "binary_cross_entropy_with_logits", "sum", "mean", "max", "min", "amax",
                  "amin", "argmax", "argmin", "norm", "linalg_vector_norm", "var", "std", "var_mean", "prod",
                  "logsumexp", "cumsum", "topk", "all", "any", "max_pool2d", "max_pool2d_with_indices",
                  "max_pool2d_with_indices_backward", "avg_pool2d", "avg_pool2d_backward", "adaptive_avg_pool2d",
                  "_adaptive_avg_pool2d", "_adaptive_avg_pool2d_backward", "adaptive_max_pool2d", "mkldnn_max_pool2d",
                  "smooth_l1_loss", "l1_loss", "huber_loss", "_safe_softmax", "safe_softmax"},
    "layout": {"contiguous", "clone", "cat", "stack", "transpose", "permute", "view", "reshape", "_reshape_alias",
               "as_strided", "as_strided_", "t", "expand", "expand_as", "empty", "empty_like", "empty_strided",
               "new_empty", "new_empty_strided", "zeros", "zeros_like", "zero_", "fill_", "ones", "ones_like",
               "resize_", "index_select", "embedding", "embedding_backward", "embedding_dense_backward", "gather",
               "scatter", "scatter_add_", "index", "index_put_", "_index_put_impl_", "slice", "select", "narrow",
               "split", "split_with_sizes", "chunk", "unsqueeze", "squeeze", "flatten", "detach", "detach_",
               "_unsafe_view", "unbind", "constant_pad_nd", "pad", "alias", "lift_fresh", "_to_dense", "unfold",
               "im2col", "col2im", "repeat", "tril", "triu", "new_zeros", "full", "arange", "masked_select",
               "set_", "copy", "_copy_from", "_copy_from_and_resize", "numpy_T", "movedim", "roll", "flip",
               "split_with_sizes_copy", "slice_backward", "select_backward", "unsafe_split", "_unsafe_index",
               "upsample_nearest2d", "upsample_bilinear2d", "upsample_nearest2d_backward", "grid_sampler_2d",
               "unsafe_view", "reshape_alias", "resolve_conj", "resolve_neg"},
    "cast": {"_autocast_to_reduced_precision", "_autocast_to_full_precision", "type_as", "_cast_Half",
             "_cast_Float", "_cast_BFloat16", "_to_copy", "to"},
    "optimizer": {"_amp_foreach_non_finite_check_and_unscale_", "_amp_update_scale_", "_fused_adam_",
                  "_fused_adamw_", "_fused_sgd_", "_fused_adagrad_"},
    "communication": {"record_param_comms", "allreduce_", "all_reduce", "broadcast_", "allgather_",
                      "reduce_scatter_", "barrier"},
}
_OP_INDEX = {op: category for category, ops in _OP_SETS.items() for op in ops}
_ELEMENTWISE = re.compile(r"^(?:add|sub|rsub|mul|div|true_divide|relu|threshold|gelu|silu|tanh|sigmoid|exp|log|"
                          r"pow|sqrt|rsqrt|neg|clamp|clamp_min|clamp_max|clip|dropout|native_dropout|bernoulli|where|"
                          r"masked_fill|addcmul|addcdiv|lerp|hardtanh|leaky_relu|elu|maximum|minimum|abs|sign|erf|"
                          r"cos|sin|isfinite|isnan|isinf|isneginf|isposinf|ne|eq|lt|gt|ge|le|hardswish|hardsigmoid|"
                          r"mish|softplus|reciprocal|square|floor|ceil|round|fmod|remainder|sgn|copysign|nan_to_num|"
                          r"rand|randn|normal|uniform|_fused_dropout|fused_dropout|glu|prelu|selu|celu|log1p|expm1|"
                          r"scalar_tensor|sigmoid_backward|tanh_backward|gelu_backward|silu_backward|"
                          r"threshold_backward|native_dropout_backward|leaky_relu_backward|hardtanh_backward|"
                          r"hardswish_backward|elu_backward|softplus_backward|glu_backward|accumulategrad)_?$|"
                          r"^(?:logical_|bitwise_|special_)")
_AUTOGRAD_NODE = re.compile(r"^(?:autograd::engine::evaluate_function: )?(?:torch::autograd::)?(\w+?)(?:Backward\d*)?$")


def _dtypes(input_types) -> list[str]:
    """The tensor dtypes among a cpu_op's recorded input types ('Scalar', '' and lists dropped)."""
    return [t for t in (input_types or []) if isinstance(t, str) and t and t not in ("Scalar", "ScalarList",
                                                                                     "TensorList", "GenericList")]


def copy_is_cast(input_types) -> bool | None:
    """An `aten::copy_(dst, src)`: True when the recorded dtypes differ, None when not recorded."""
    dtypes = _dtypes(input_types)
    return None if len(dtypes) < 2 else dtypes[0] != dtypes[1]


def classify_op(name: str, input_types=None, in_optimizer: bool = False) -> str:
    """Category of one CPU op's self time. `in_optimizer`: it ran inside the profiler's
    `Optimizer.step#...`/`Optimizer.zero_grad#...` region, so it is the optimizer's, whatever it is."""
    if in_optimizer or name.startswith("Optimizer."):
        return "optimizer"
    if name.startswith(COMPILED_GRAPH):  # Inductor's fused C++ kernels (pointwise, reductions, norms);
        return "elementwise"  # its GEMMs and convolutions stay aten ops (externs), counted as such
    if name.startswith(("c10d::", "gloo:", "nccl:", "c10d")) or "ProcessGroup" in name:
        return "communication"
    node = _AUTOGRAD_NODE.match(name)
    if node and (name.startswith(("autograd::", "torch::autograd::")) or re.search(r"Backward\d*$", name)):
        return _classify_autograd_node(node.group(1))
    base = name.split("::", 1)[1] if name.startswith("aten::") else name
    if base.startswith("_foreach_") or base.startswith("_fused_"):
        return "optimizer"
    if base in ("copy_", "copy"):
        return "cast" if copy_is_cast(input_types) else "layout"
    if base in _OP_INDEX:
        return _OP_INDEX[base]
    if _ELEMENTWISE.match(base.lower()):
        return "elementwise"
    if "scaled_dot_product" in base or "flash_attention" in base or "efficient_attention" in base:
        return "attention"
    return "other"


def _classify_autograd_node(node: str) -> str:
    """An autograd node's own time (engine bookkeeping around the backward op) goes to the category
    of the op it differentiates: ConvolutionBackward0 -> conv, AddmmBackward0 -> gemm, ToCopyBackward0
    -> cast, AccumulateGrad -> elementwise (it adds or stores the gradient)."""
    if node == "AccumulateGrad":
        return "elementwise"
    if node == "ToCopy":
        return "cast"
    snake = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", node).lower()
    if snake.startswith("max_pool") or snake.startswith("avg_pool") or snake.startswith("adaptive_"):
        return "reduction"
    if "scaled_dot_product" in snake:
        return "attention"
    category = classify_op("aten::" + snake)
    return category if category != "other" else classify_op("aten::" + snake.rstrip("0123456789_"))
