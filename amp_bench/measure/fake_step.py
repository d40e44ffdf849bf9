"""One training step of a case recorded on fake tensors (shapes and dtypes, no data, no compute): the op
inventory `predict` prices for a GPU it does not have, and the memory the step holds, from any machine.

The step is the worker's (measure/step.py): zero_grad, autocast(forward + loss), backward (scaled under
fp16), the optimizer step, after one step that gave the optimizer its state. Every aten op that reaches
the dispatcher is written as the Chrome-trace `cpu_op` event torch.profiler records with shapes (Input
Dims, Input type, Input Strides, Concrete Inputs), so analysis/predict reads it as it reads a CPU run's
trace; a TensorList input keeps its tensors' shapes (as the profiler records them) and their dtype (which
the profiler leaves out: a `cat` is priced by its bytes). Memory: every storage an op makes is counted
while a tensor holds it, at the CUDA caching allocator's 512-byte granularity: the step's peak, and its
parts (weights, gradients, optimizer state, what the forward keeps for backward).

Why fake CPU tensors with CUDA's policy applied by hand: autograd's engine refuses fake CUDA tensors on
a machine without a GPU (it asks the driver for the device's context), so the tensors are fake CPU ones.
CPU autocast casts the same matmuls and convolutions CUDA's does; CudaPolicy runs in FP32 what CUDA
autocast runs in FP32 and CPU autocast does not (aten/src/ATen/autocast_mode.h: AT_FORALL_FP32 and
AT_FORALL_FP32_SET_OPT_DTYPE). GradScaler's step() reads found_inf on the host, which a fake tensor cannot
answer, so its kernels are called as it calls them. Module.to(memory_format=...) swaps parameters, which
fake tensors refuse, so channels_last restrides them in place (the same strides). Nothing here exists in
torch: FakeTensorMode gives shapes, not a profiler's trace or an allocator's peak.
"""
from __future__ import annotations

import gzip
import json
import weakref
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from amp_bench import modes

FORMAT = 1  # the inventory's format: a cached one of another format is captured again
BLOCK = 512  # the CUDA caching allocator rounds every allocation up to a multiple of this
KINETO_TYPES = {torch.float32: "float", torch.float16: "c10::Half", torch.bfloat16: "c10::BFloat16",
                torch.float64: "double", torch.int64: "long int", torch.int32: "int", torch.bool: "bool",
                torch.uint8: "unsigned char", torch.int8: "signed char", torch.float8_e4m3fn: "c10::Float8_e4m3fn",
                torch.float8_e5m2: "c10::Float8_e5m2"}
STEP_REGION = "amp_bench::step"  # the region analysis/explain/events.py reads as the profiled step
# CUDA autocast's FP32 policies that CPU autocast lacks: inputs cast to FP32 ...
CUDA_FP32 = {"layer_norm", "group_norm", "exp", "log", "pow", "rsqrt", "reciprocal", "softplus", "log1p", "expm1",
             "erfinv", "logsumexp", "cosine_similarity", "kl_div", "mse_loss", "l1_loss", "smooth_l1_loss"}
# ... or an FP32 output dtype (fp32_set_opt_dtype)
CUDA_FP32_OUT = {"softmax", "log_softmax", "sum", "cumsum", "prod", "cumprod"}
_LOW = (torch.float16, torch.bfloat16)


def _fused_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **_):
    """scaled_dot_product_attention as one fused op, as CUDA runs it (flash or memory-efficient kernels): the
    CPU's flash op, which fake tensors run at any dropout (on fake CPU tensors SDPA would otherwise take its
    math path: matmuls, a softmax and dropout's masks a GPU never launches)."""
    dtype = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else query.dtype
    query, key, value = (t.to(dtype) for t in (query, key, value))
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(query, key, value, dropout_p, is_causal,
                                                                       attn_mask=attn_mask, scale=scale)[0]


class CudaPolicy(TorchFunctionMode):
    """What CUDA runs that CPU autocast on fake CPU tensors would run otherwise: inside autocast, the ops
    CUDA autocast runs in FP32 (and CPU autocast does not) in FP32; attention as one fused op."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "").rstrip("_")
        if func is torch.nn.functional.scaled_dot_product_attention and not kwargs.get("enable_gqa"):
            return _fused_attention(*args, **kwargs)
        if torch.is_autocast_enabled("cpu"):
            if name in CUDA_FP32:
                args = tuple(a.float() if isinstance(a, torch.Tensor) and a.dtype in _LOW else a for a in args)
            elif name in CUDA_FP32_OUT and any(isinstance(a, torch.Tensor) and a.dtype in _LOW for a in args):
                kwargs = {**kwargs, "dtype": torch.float32}
        return func(*args, **kwargs)


def _concrete(value) -> str:
    if isinstance(value, (list, tuple)) and all(isinstance(v, (int, bool)) for v in value):
        return "[" + ", ".join(str(int(v)) for v in value) + "]"
    return str(value) if isinstance(value, (bool, int, float)) else ""


def _tensor_list(value) -> bool:
    return isinstance(value, (list, tuple)) and bool(value) and all(isinstance(t, torch.Tensor) for t in value)


def _dtype(tensor: torch.Tensor) -> torch.dtype:
    """What a kernel reads: a wrapper subclass's data (torchao's float8 tensors hold float8 `_data` behind a
    high-precision dtype; their matmul dispatches as aten::mm and runs _scaled_mm on the data)."""
    inner = getattr(tensor, "_data", None)
    return inner.dtype if isinstance(inner, torch.Tensor) else tensor.dtype


def _args(args) -> dict:
    """The profiler's record of an op's inputs: one entry per argument in each field."""
    dims, types, strides, concrete, lists = [], [], [], [], []
    for arg in args:
        if isinstance(arg, torch.Tensor):
            dims.append(list(arg.shape)), types.append(KINETO_TYPES.get(_dtype(arg), str(_dtype(arg))))
            strides.append(list(arg.stride())), concrete.append(""), lists.append("")
        elif _tensor_list(arg):
            dims.append([list(t.shape) for t in arg]), types.append("TensorList"), strides.append([])
            concrete.append(""), lists.append(KINETO_TYPES.get(arg[0].dtype, str(arg[0].dtype)))
        else:
            dims.append([]), types.append("ScalarList" if isinstance(arg, (list, tuple)) else "Scalar")
            strides.append([]), concrete.append(_concrete(arg)), lists.append("")
    return {"Input Dims": dims, "Input type": types, "Input Strides": strides, "Concrete Inputs": concrete,
            "TensorList type": lists}


class StepRecorder(TorchDispatchMode):
    """Every aten op as a cpu_op event (a _foreach_ op as a parent with one child per tensor, as a CPU trace
    shows them), and the bytes the storages alive hold: now, and the most since `reset_peak`."""

    def __init__(self):
        super().__init__()
        self.events, self.clock = [], 0
        self.holders: dict[int, int] = {}  # storage -> tensors holding it
        self.sizes: dict[int, int] = {}
        self.live = self.peak = 0

    def _event(self, name: str, args, dur: int = 1) -> dict:
        self.clock += 2
        event = {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": self.clock, "dur": dur,
                 "args": _args(args)}
        self.events.append(event)
        return event

    def region(self, name: str, start: int) -> None:
        self.events.append({"ph": "X", "cat": "user_annotation", "name": name, "pid": 1, "tid": 1, "ts": start,
                            "dur": self.clock - start + 1})

    def hold(self, tensor: torch.Tensor) -> None:
        """Count the tensor's storage while any tensor that was seen holding it is alive."""
        storage = tensor.untyped_storage()
        key = storage._cdata
        if key not in self.holders:
            self.holders[key], self.sizes[key] = 0, -(-storage.nbytes() // BLOCK) * BLOCK
            self.live += self.sizes[key]
            self.peak = max(self.peak, self.live)
        self.holders[key] += 1
        weakref.finalize(tensor, self._release, key)

    def _release(self, key: int) -> None:
        self.holders[key] -= 1
        if not self.holders[key]:
            del self.holders[key]
            self.live -= self.sizes.pop(key)

    def reset_peak(self) -> None:
        self.peak = self.live

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = "aten::" + func._schema.name.split("::")[-1]
        lists = [a for a in args if _tensor_list(a)]
        if name.startswith("aten::_foreach_") and lists:
            parent = self._event(name, args, dur=4 * len(lists[0]) + 2)
            for i in range(len(lists[0])):
                self._event("aten::" + name[len("aten::_foreach_"):].rstrip("_") + "_",
                            [a[i] if _tensor_list(a) and len(a) > i else a for a in args])
            self.clock = parent["ts"] + parent["dur"]
        else:
            self._event(name, args)
        out = func(*args, **(kwargs or {}))
        for tensor in tree_flatten(out)[0]:
            if isinstance(tensor, torch.Tensor):
                self.hold(tensor)
        return out


def _tensors(*trees) -> list[torch.Tensor]:
    return [t for tree in trees for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


def _nbytes(tensors) -> int:
    return sum(-(-t.untyped_storage().nbytes() // BLOCK) * BLOCK for t in {t.untyped_storage()._cdata: t
                                                                          for t in tensors}.values())


def _channels_last(model, inputs):
    """model and image batch in channels_last, restrided in place (fake tensors refuse Module.to's swap)."""
    for tensor in [*model.parameters(), *model.buffers()]:
        if tensor.dim() == 4:
            tensor.data = tensor.data.contiguous(memory_format=torch.channels_last)
    if isinstance(inputs, torch.Tensor) and inputs.dim() == 4:
        inputs = inputs.contiguous(memory_format=torch.channels_last)
    return inputs


def _backward_and_step(loss, params, optimizer, scaled: bool, recorder: StepRecorder) -> int:
    """backward, then the optimizer step (with GradScaler's kernels as its scale/unscale_/step/update call
    them, the loss scale on the device, when `scaled`); returns the clock where the optimizer's part began."""
    scale, found_inf = torch.full((1,), 65536.0), torch.zeros(1)
    (loss * scale if scaled else loss).backward()
    start = recorder.clock
    if scaled:
        grads = [p.grad for p in params if p.grad is not None]
        torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, scale.double().reciprocal().float())
    optimizer.step()
    if scaled:
        torch._amp_update_scale_(scale, torch.zeros(1, dtype=torch.int32), found_inf, 2.0, 0.5, 2000)
    return start


def record_step(model, inputs, target, loss_fn, optimizer, mode: modes.Mode) -> tuple[dict, dict]:
    """(the Chrome trace of one steady-state step, its memory in bytes) of a model built under FakeTensorMode."""
    from amp_bench.measure.models import forward
    params = [p for p in model.parameters() if p.requires_grad]
    for param in params:  # a first step's state, so the recorded step is a steady-state one
        param.grad = torch.zeros_like(param)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    recorder, state = StepRecorder(), _tensors(list(optimizer.state.values()))
    dtype = getattr(torch, mode.autocast_dtype) if mode.autocast_dtype else torch.bfloat16
    with recorder:
        for tensor in [*params, *model.buffers(), *state, *_tensors(inputs, target)]:
            recorder.hold(tensor)
        recorder.reset_peak()
        before = recorder.live
        with CudaPolicy(), torch.autocast("cpu", dtype=dtype, enabled=mode.uses_autocast):
            loss = loss_fn(forward(model, inputs), target)
        kept = recorder.live - before
        start = _backward_and_step(loss, params, optimizer, mode.grad_scaler, recorder)
        recorder.region(f"Optimizer.step#{type(optimizer).__name__}.step", start)
    memory = {"weights": _nbytes(params), "buffers": _nbytes(list(model.buffers())),
              "optimizer_state": _nbytes(state), "gradients": _nbytes([p.grad for p in params if p.grad is not None]),
              "batch": _nbytes(_tensors(inputs, target)), "forward_kept": kept, "peak": recorder.peak}
    events = [{"ph": "X", "cat": "user_annotation", "name": STEP_REGION, "pid": 1, "tid": 1, "ts": 0,
               "dur": recorder.clock + 10}, *recorder.events]
    return {"traceEvents": events}, memory


def record_case(case) -> tuple[dict, dict, dict]:
    """(trace, memory, details) of one step of a suite's case on fake tensors: its model, batch, layout,
    optimizer and mode as a worker would run them (fp8: torchao's float8 linears, the rest under bf16)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from amp_bench.measure.models import build_workload
    from amp_bench.measure.step import build_optimizer
    mode = modes.get(case.precision)
    with FakeTensorMode(allow_non_fake_inputs=True):
        workload = build_workload(case.model.__dict__, image_size=case.image_size, seq_len=case.seq_len,
                                  channels_last=False, search_dirs=case.search_dirs)
        model = workload.model.train()
        inputs, target = workload.make_batch(case.batch_size, torch.device("cpu"))
        if case.channels_last:
            inputs = _channels_last(model, inputs)
        details = dict(workload.details)
        if mode.float8_linear:  # before the optimizer: it must hold the converted layers' weights
            from amp_bench.measure.fp8 import convert
            details.update(convert(model, case.fp8_recipe, "cuda", case.fp8_skip_first_last))
        optimizer = build_optimizer(model.parameters(), case.optimizer)
        trace, memory = record_step(model, inputs, target, workload.loss_fn, optimizer, mode)
    details["model_parameters"] = sum(p.numel() for p in model.parameters())
    return trace, memory, details


def save(trace: dict, memory: dict, trace_path: str, memory_path: str) -> None:
    """The trace (gzip JSON) and the memory record, each written under a temporary name and renamed: a
    reader of the cache (store/inventories.py) never sees half of one."""
    for path, write in ((Path(trace_path), lambda fh: json.dump(trace, fh)),
                        (Path(memory_path), lambda fh: json.dump(memory, fh))):
        path.parent.mkdir(parents=True, exist_ok=True)
        part = path.with_name(path.name + ".part")
        with (gzip.open(part, "wt", encoding="utf-8") if path.suffix == ".gz" else
              part.open("w", encoding="utf-8")) as fh:
            write(fh)
        part.replace(path)
