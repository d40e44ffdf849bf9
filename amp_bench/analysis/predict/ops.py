"""FLOPs, bytes and math type of one aten op, from what torch.profiler records with shapes: `Input Dims`,
`Input type` and `Concrete Inputs` (strides, paddings and flags as strings); torch-free.

Why by hand: torch's FlopCounterMode needs torch and live tensors; a saved trace only has these
strings. FLOPs follow FlopCounterMode's convention (2 per multiply-add); only GEMMs, convolutions and
attention count (elementwise FLOPs are negligible against their bytes). Bytes are the tensors an op
reads plus the one it writes, at the recorded dtypes: a first-order figure (caches, fusion and
layout transforms inside a kernel are not seen), which is why a GPU source keeps the time each op
really took and only scales it.
"""
from __future__ import annotations

import ast
import contextlib
from dataclasses import dataclass
from math import prod

DTYPE_BYTES = {"float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "c10::Float8_e4m3fn": 1,
               "c10::Float8_e5m2": 1, "c10::Float8_e4m3fnuz": 1, "c10::Float8_e5m2fnuz": 1, "long int": 8,
               "int": 4, "short int": 2, "bool": 1, "unsigned char": 1, "signed char": 1,
               "c10::complex<float>": 8, "c10::complex<double>": 16}
MATH = {"float": "fp32", "c10::Half": "fp16", "c10::BFloat16": "bf16", "c10::Float8_e4m3fn": "fp8",
        "c10::Float8_e5m2": "fp8", "c10::Float8_e4m3fnuz": "fp8", "c10::Float8_e5m2fnuz": "fp8"}

# ops that launch no kernel: views, metadata and allocation
NO_KERNEL = {"view", "reshape", "_reshape_alias", "as_strided", "as_strided_", "t", "transpose", "permute", "expand",
             "expand_as", "unsqueeze", "squeeze", "detach", "detach_", "alias", "slice", "select", "split",
             "split_with_sizes", "unbind", "chunk", "narrow", "empty", "empty_like", "empty_strided", "new_empty",
             "new_empty_strided", "empty_permuted", "resize_", "set_", "lift_fresh", "_unsafe_view", "numpy_T",
             "flatten", "unflatten", "view_as", "movedim", "contiguous", "resolve_conj", "resolve_neg", "size",
             "stride", "is_nonzero", "item", "_local_scalar_dense", "unsafe_split", "_has_compatible_shallow_copy_type",
             "to", "type_as", "_to_dense", "record_stream", "zeros", "ones", "full", "device", "is_same_size",
             "_record_function_enter_new", "_record_function_exit", "sym_size", "sym_stride", "sym_numel", "dim",
             "is_contiguous", "_nested_tensor_size"}
GEMM_OPS = {"mm", "addmm", "bmm", "baddbmm", "addbmm", "_scaled_mm", "linear", "matmul", "_int_mm"}
CONV_OPS = {"conv1d", "conv2d", "conv3d", "convolution", "_convolution", "cudnn_convolution", "mkldnn_convolution",
            "_slow_conv2d_forward", "thnn_conv2d", "_conv_depthwise2d", "convolution_overrideable"}
CONV_BACKWARD_OPS = {"convolution_backward", "mkldnn_convolution_backward", "cudnn_convolution_backward",
                     "convolution_backward_overrideable"}
# outputs much smaller than the input: bytes are what they read
REDUCTIONS = {"sum", "mean", "amax", "amin", "max", "min", "norm", "linalg_vector_norm", "var", "std", "var_mean",
              "argmax", "argmin", "all", "any", "prod", "nll_loss_forward", "nll_loss", "nll_loss_nd",
              "_foreach_norm", "batch_norm_stats", "logsumexp"}
FUSED_OPTIMIZERS = {"_fused_adam_", "_fused_adamw_", "_fused_sgd_", "_fused_adagrad_"}
SCALARS = {"Scalar", "ScalarList", ""}  # what a factory op's recorded inputs are
CONCATS = {"cat", "_cat", "stack", "hstack", "vstack", "concat", "concatenate"}  # they write all they read
# A GEMM's operands must start every row on a 16-byte boundary for the vectorised Tensor Core kernels
# (NVIDIA's Matrix Multiplication Background guide: multiples of 8 in 16-bit, 16 in fp8, 4 in TF32);
# otherwise CUTLASS's align1/align2 kernels run (GPT-2's 50257-wide lm_head on this project's H200 reading)
ALIGN_ELEMENTS = {"fp32": 4, "fp16": 8, "bf16": 8, "fp8": 16}


@dataclass(frozen=True)
class OpCost:
    flops: float  # 2 per multiply-add; 0 for memory-bound ops
    bytes: float  # read + written
    math: str | None  # "fp32", "fp16", "bf16", "fp8": the compute's input type (None when flops is 0)
    nchw_bytes: float = 0.0  # a convolution on NCHW tensors: what an NCHW<->NHWC transform of them moves
    misaligned: bool = False  # a GEMM whose inner or output dimension breaks ALIGN_ELEMENTS


def base_name(name: str) -> str:
    return name.split("::", 1)[1] if name.startswith("aten::") else name


def _tensors(dims, types, list_types=None) -> list[tuple[list[int], str]]:
    """(shape, dtype) of the recorded tensor inputs (scalars and absent tensors dropped; a 0-d tensor has
    shape []). A TensorList's tensors count one by one, in the dtype recorded beside it (amp_bench's fake
    step records it; torch.profiler does not: the op's first plain tensor's dtype then, else FP32)."""
    plain = [t for t in types or [] if t in DTYPE_BYTES]
    out = []
    for i, (shape, dtype) in enumerate(zip(dims or [], types or [], strict=False)):
        if dtype in DTYPE_BYTES and isinstance(shape, list):
            out.append(([int(d) for d in shape], dtype))
        elif dtype == "TensorList" and isinstance(shape, list) and all(isinstance(s, list) for s in shape):
            given = (list_types or [])[i] if i < len(list_types or []) else ""
            element = given if given in DTYPE_BYTES else (plain[0] if plain else "float")
            out += [([int(d) for d in s], element) for s in shape]
    return out


def _nbytes(shape: list[int], dtype: str) -> float:
    return float(prod(shape)) * DTYPE_BYTES.get(dtype, 4)


def _lists(concrete) -> list[list[int]]:
    """The integer lists among Concrete Inputs ('[2, 2]'), in order."""
    out = []
    for text in concrete or []:
        if isinstance(text, str) and text.startswith("["):
            with contextlib.suppress(ValueError, SyntaxError):  # not a Python literal: not a list of ints
                value = ast.literal_eval(text)
                if isinstance(value, list) and all(isinstance(v, (int, bool)) for v in value):
                    out.append([int(v) for v in value])
    return out


def _groups(concrete) -> int:
    """A convolution's groups: the last plain integer among Concrete Inputs (1 when none)."""
    return next((max(int(text), 1) for text in reversed(concrete or [])
                 if isinstance(text, str) and text.strip().lstrip("-").isdigit()), 1)


def _gemm(name: str, tensors) -> OpCost | None:
    shapes = [s for s, _ in tensors]
    math = MATH.get(tensors[0][1]) if tensors else None
    if name in ("addmm", "baddbmm", "addbmm") and len(shapes) >= 3:
        shapes = shapes[1:3]
    if len(shapes) < 2 or len(shapes[0]) < 2 or len(shapes[1]) < 1:
        return None
    a, b = shapes[0], shapes[1]
    if name == "linear":  # x[..., K] @ w[N, K]^T
        m, k, n, batch = prod(a[:-1]), a[-1], b[0], 1
    else:
        m, k, n = a[-2], a[-1], b[-1]
        batch = prod(a[:-2]) if len(a) > 2 else 1
    if name in ("addmm", "baddbmm", "addbmm"):
        math = MATH.get(tensors[1][1])
    flops = 2.0 * batch * m * k * n
    moved = sum(_nbytes(s, d) for s, d in tensors) + batch * m * n * DTYPE_BYTES.get(tensors[0][1], 4)
    align = ALIGN_ELEMENTS.get(math or "", 1)
    return OpCost(flops, moved, math, misaligned=bool(k % align or n % align))


def _conv_out(spatial, kernel, stride, padding, dilation) -> list[int]:
    return [max((i + 2 * p - d * (k - 1) - 1) // max(s, 1) + 1, 1)
            for i, k, s, p, d in zip(spatial, kernel, stride, padding, dilation, strict=False)]


def _conv(tensors, concrete, base: str = "convolution") -> OpCost | None:
    if len(tensors) < 2 or len(tensors[0][0]) < 3:
        return None
    (x, dtype), (w, _) = tensors[0], tensors[1]
    spatial, kernel = x[2:], w[2:]
    n_dims = len(spatial)
    lists = _lists(concrete) + [[1] * n_dims, [0] * n_dims, [1] * n_dims]
    stride, padding, dilation = (lst if len(lst) == n_dims else lst[:1] * n_dims for lst in lists[:3])
    if base == "mkldnn_convolution":  # its schema lists padding before stride
        stride, padding = padding, stride
    out = _conv_out(spatial, kernel, stride, padding, dilation)
    macs = x[0] * w[0] * prod(out) * w[1] * prod(kernel)  # w[1] is in_channels / groups
    written = x[0] * w[0] * prod(out) * DTYPE_BYTES.get(dtype, 4)
    activations = _nbytes(x, dtype) + written  # read and written again by an NCHW<->NHWC transform
    return OpCost(2.0 * macs, _nbytes(x, dtype) + _nbytes(w, tensors[1][1]) + written, MATH.get(dtype), 2 * activations)


def _conv_backward(tensors, concrete) -> OpCost | None:
    """convolution_backward(grad_output, input, weight, ..., output_mask): the input gradient and the
    weight gradient each cost the forward's multiply-adds, when the mask asks for them."""
    if len(tensors) < 3:
        return None
    (dy, dtype), (x, _), (w, _) = tensors[:3]
    mask = _lists(concrete)[-1] if _lists(concrete) and len(_lists(concrete)[-1]) == 3 else [1, 1, 0]
    macs = dy[0] * w[0] * prod(dy[2:]) * w[1] * prod(w[2:])
    wanted = (1 if mask[0] else 0) + (1 if mask[1] else 0)
    moved = sum(_nbytes(s, d) for s, d in tensors[:3]) + (_nbytes(x, dtype) if mask[0] else 0) + \
        (_nbytes(w, tensors[2][1]) if mask[1] else 0)
    activations = _nbytes(dy, dtype) + _nbytes(x, dtype) * (2 if mask[0] else 1)
    return OpCost(2.0 * macs * wanted, moved, MATH.get(dtype), 2 * activations)


def _attention(name: str, tensors) -> OpCost | None:
    """Scaled dot-product attention on q[B, H, S, D], k[B, H, Sk, D]: 2 x 2 x B H S Sk D forward
    (QK^T and PV); a backward costs 2.5x that (five matmuls against two)."""
    if len(tensors) < 3 or len(tensors[0][0]) < 3:
        return None
    q, k = tensors[0][0], tensors[1][0]
    flops = 4.0 * prod(q[:-1]) * k[-2] * q[-1]
    if "backward" in name:
        flops *= 2.5
    moved = sum(_nbytes(s, d) for s, d in tensors) + _nbytes(q, tensors[0][1])
    return OpCost(flops, moved, MATH.get(tensors[0][1]))


def _nchw(strides) -> bool:
    """The first input is a 4-D NCHW-contiguous tensor (its channel stride is H x W, not 1)."""
    first = (strides or [None])[0]
    return isinstance(first, list) and len(first) == 4 and first[1] != 1 and first[3] == 1


def op_cost(name: str, dims, types, concrete=None, strides=None, list_types=None) -> OpCost | None:
    """The cost of one recorded op; None when it launches no kernel (a view, an allocation) or its
    tensors were not recorded (a TensorList: its per-tensor children are costed instead; a fused
    optimizer's tensor lists are costed from their shapes). `strides`
    (Input Strides) tell an NCHW convolution: cuDNN's tensor-core kernels are NHWC, so on TF32, 16-bit
    or FP8 math its activations are transformed there and back (Holistic Trace Analysis's public A100
    trace shows nchwToNhwcKernel launched beside the sm80 TF32 fprop kernels), which nchw_bytes prices."""
    cost = _op_cost(base_name(name), dims, types, concrete, list_types)
    if cost is None or not cost.nchw_bytes or _nchw(strides):
        return cost
    return OpCost(cost.flops, cost.bytes, cost.math)  # NHWC already: nothing to transform


def _fused_optimizer(dims) -> OpCost | None:
    """A fused optimizer step (`_fused_adam_`, `_fused_adamw_`, `_fused_sgd_`, `_fused_adagrad_`): its
    inputs are tensor lists (params, grads, then each state such as exp_avg and exp_avg_sq; the step
    counters are 0-d), so the recorded dims are lists of shapes and the dtypes only 'TensorList'.
    One pass over every element: the params and each state read and written, the grads read. FP32
    (4 bytes) is assumed, as AMP's master weights and optimizer states are: an AdamW step moves
    7 x 4 bytes an element, where its foreach form's eight passes move about 84."""
    lists = [d for d in dims or [] if isinstance(d, list) and d and all(isinstance(s, list) for s in d)]
    if not lists or not any(lists[0]):
        return None
    like_params = [d for d in lists if d == lists[0]]  # params, grads and the per-element states
    elements = sum(prod(shape) for shape in lists[0])
    return OpCost(0.0, float(elements) * 4 * (2 * len(like_params) - 1), None)


def _op_cost(base: str, dims, types, concrete, list_types=None) -> OpCost | None:
    if base in NO_KERNEL:
        return None
    if base in FUSED_OPTIMIZERS:
        return _fused_optimizer(dims)
    if base.startswith("_foreach_"):
        return None  # its per-tensor children are costed (a CPU trace shows them), and grouped as one launch
    tensors = _tensors(dims, types, list_types)
    if not tensors:
        # a factory op (arange, randint, scalar_tensor): one kernel; what it writes the trace does not say
        return OpCost(0.0, 0.0, None) if types and all(t in SCALARS for t in types) else None
    if base in GEMM_OPS:
        return _gemm(base, tensors)
    if base in CONV_OPS:
        return _conv(tensors, concrete, base)
    if base in CONV_BACKWARD_OPS:
        return _conv_backward(tensors, concrete)
    if "attention" in base and any(k in base for k in ("scaled_dot_product", "flash", "efficient")):
        return _attention(base, tensors)
    read = sum(_nbytes(s, d) for s, d in tensors)
    if base in REDUCTIONS:
        return OpCost(0.0, read, None)
    largest = max(tensors, key=lambda t: prod(t[0]))
    whole_list = base in CONCATS or "foreach" in base  # a concat writes all it read; _amp_foreach_* works in place
    written = 2 * prod(largest[0]) if base in ("_to_copy", "to") else read if whole_list else _nbytes(*largest)
    return OpCost(0.0, read + written, None)


def is_costed(name: str) -> bool:
    """Whether the model costs this op itself (an aten op that launches kernels); other events (autograd
    nodes, Python regions, TensorList ops) are looked through to their children."""
    return name.startswith("aten::") and base_name(name) not in NO_KERNEL
