"""Op inventories of whole training steps at the published batch sizes, for scoring `predict`'s op-inventory
path against the public AMP tables (benchmarks/predict_amp.py), with no GPU and no real compute.

One training step (forward, loss, backward, optimizer; GradScaler under fp16) runs on fake tensors
(torch._subclasses.FakeTensorMode: shapes and dtypes, no data), and every aten op that reaches the
dispatcher is written as a Chrome-trace `cpu_op` event with the fields torch.profiler records with
shapes (`Input Dims`, `Input type`, `Input Strides`, `Concrete Inputs`): the very trace predict reads
from a CPU run (analysis/predict/inventory.py), at a batch no 2-core CPU could train.

Autocast: fake tensors live on the CPU, so CPU autocast casts the GEMMs and convolutions; CUDA's policy
also runs the ops in its FP32 lists in FP32 (aten/src/ATen/autocast_mode.h: AT_FORALL_FP32 and
AT_FORALL_FP32_SET_OPT_DTYPE: layer_norm, group_norm, softmax, log_softmax, sum, cumsum, exp, log, pow,
rsqrt, ...), which CPU autocast does not: a TorchFunctionMode applies that difference (FP32 inputs, or
dtype=float32 where the policy sets the output dtype), so the inventory is CUDA's.

    python benchmarks/predict_inventory.py resnet50 256 amp_fp16 --channels-last -o out.json.gz
"""
from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

KINETO_TYPES = {torch.float32: "float", torch.float16: "c10::Half", torch.bfloat16: "c10::BFloat16",
                torch.float64: "double", torch.int64: "long int", torch.int32: "int", torch.bool: "bool",
                torch.uint8: "unsigned char"}
# CUDA autocast's FP32 policies that CPU autocast lacks (autocast_mode.h): inputs to FP32 ...
CUDA_FP32 = {"layer_norm", "group_norm", "exp", "log", "pow", "rsqrt", "reciprocal", "softplus", "log1p",
             "expm1", "erfinv", "logsumexp", "cosine_similarity", "kl_div", "mse_loss", "l1_loss", "smooth_l1_loss"}
# ... or an FP32 output dtype (fp32_set_opt_dtype)
CUDA_FP32_OUT = {"softmax", "log_softmax", "sum", "cumsum", "prod", "cumprod"}


def _cast_fp32(value):
    if isinstance(value, torch.Tensor) and value.dtype in (torch.float16, torch.bfloat16):
        return value.float()
    return value


class CudaAutocastFp32(TorchFunctionMode):
    """The ops CUDA autocast runs in FP32 and CPU autocast does not, run in FP32 (inside autocast only)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if torch.is_autocast_enabled("cpu"):
            if name in CUDA_FP32 or name.rstrip("_") in CUDA_FP32:
                args = tuple(_cast_fp32(a) for a in args)
            elif name in CUDA_FP32_OUT and any(isinstance(a, torch.Tensor) and a.dtype in (torch.float16,
                                                                                        torch.bfloat16) for a in args):
                kwargs = {**kwargs, "dtype": torch.float32}
        return func(*args, **kwargs)


def _concrete(value) -> str:
    if isinstance(value, (list, tuple)) and all(isinstance(v, (int, bool)) for v in value):
        return "[" + ", ".join(str(int(v)) for v in value) + "]"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, (int, float)):
        return str(value)
    return ""


def _arg_fields(args) -> tuple[list, list, list, list]:
    dims, types, strides, concrete = [], [], [], []
    for a in args:
        if isinstance(a, torch.Tensor):
            dims.append(list(a.shape)), types.append(KINETO_TYPES.get(a.dtype, str(a.dtype)))
            strides.append(list(a.stride())), concrete.append("")
        elif isinstance(a, (list, tuple)) and a and all(isinstance(t, torch.Tensor) for t in a):
            dims.append([]), types.append("TensorList"), strides.append([]), concrete.append("")
        else:
            dims.append([]), types.append("Scalar" if not isinstance(a, (list, tuple)) else "ScalarList")
            strides.append([]), concrete.append(_concrete(a))
    return dims, types, strides, concrete


class OpLog(TorchDispatchMode):
    """Every aten op as a cpu_op event; a _foreach_ op as a parent with one child per tensor, as a CPU
    trace shows them; the optimizer's ops inside an `Optimizer.step#` region."""

    def __init__(self):
        super().__init__()
        self.events, self.clock = [], 0

    def _event(self, name, args, cat="cpu_op", dur=1):
        dims, types, strides, concrete = _arg_fields(args)
        self.clock += 2
        event = {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": self.clock, "dur": dur,
                 "args": {"Input Dims": dims, "Input type": types, "Input Strides": strides,
                          "Concrete Inputs": concrete}}
        self.events.append(event)
        return event

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = "aten::" + func._schema.name.split("::")[-1]
        lists = [a for a in args if isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.Tensor)]
        if name.startswith("aten::_foreach_") and lists:
            parent = self._event(name, args, dur=4 * len(lists[0]) + 2)
            for i in range(len(lists[0])):
                self._event("aten::" + name[len("aten::_foreach_"):].rstrip("_") + "_",
                            [a[i] if isinstance(a, (list, tuple)) and len(a) > i else a for a in args])
            self.clock = parent["ts"] + parent["dur"]
        else:
            self._event(name, args)
        return func(*args, **(kwargs or {}))

    def region(self, name: str, start: int) -> None:
        self.events.append({"ph": "X", "cat": "user_annotation", "name": name, "pid": 1, "tid": 1, "ts": start,
                            "dur": self.clock - start + 1})


def build(model: str, batch: int, channels_last: bool):
    """(module, inputs, loss_fn, optimizer class and kwargs) of a workload the public tables hold."""
    if model == "resnet50":
        import torchvision
        net = torchvision.models.resnet50()
        x = torch.randn(batch, 3, 224, 224)
        if channels_last:  # Module.to(memory_format=) cannot swap fake parameters: restride them in place
            for param in net.parameters():
                if param.dim() == 4:
                    param.data = param.data.contiguous(memory_format=torch.channels_last)
            x = x.contiguous(memory_format=torch.channels_last)
        y = torch.randint(0, 1000, (batch,))
        return net, (x,), lambda out: torch.nn.functional.cross_entropy(out, y), torch.optim.SGD, \
            {"lr": 0.1, "momentum": 0.9, "foreach": True}
    from transformers import BertConfig, BertForPreTraining, BertForQuestionAnswering
    large = "large" in model
    config = BertConfig(vocab_size=30528, hidden_size=1024 if large else 768, num_hidden_layers=24 if large else 12,
                        num_attention_heads=16 if large else 12, intermediate_size=4096 if large else 3072,
                        attn_implementation="eager")
    seq = int(model.rsplit("_", 1)[1]) if model.startswith("bert_large_pretrain") else 384
    ids = torch.randint(0, 30522, (batch, seq))
    if model.startswith("bert_large_pretrain"):
        net = BertForPreTraining(config)
        labels, nsp = torch.randint(0, 30522, (batch, seq)), torch.randint(0, 2, (batch,))
        return net, (ids,), lambda out: _pretrain_loss(out, labels, nsp), torch.optim.AdamW, {"foreach": True}
    net = BertForQuestionAnswering(config)
    start, end = torch.randint(0, seq, (batch,)), torch.randint(0, seq, (batch,))
    loss = lambda out: (torch.nn.functional.cross_entropy(out.start_logits, start)
                        + torch.nn.functional.cross_entropy(out.end_logits, end)) / 2
    return net, (ids,), loss, torch.optim.AdamW, {"foreach": True}


def _pretrain_loss(out, labels, nsp):
    mlm = torch.nn.functional.cross_entropy(out.prediction_logits.flatten(0, 1), labels.flatten())
    return mlm + torch.nn.functional.cross_entropy(out.seq_relationship_logits, nsp)


def _backward_and_step(loss, net, optimizer, log: OpLog, scaled: bool) -> None:
    """backward and the optimizer step; with `scaled`, GradScaler's kernels by hand (scale the loss,
    unscale and check the gradients, update the scale): its own step() reads found_inf on the host,
    which fake tensors cannot answer."""
    if scaled:
        scale, found_inf = torch.full((1,), 256.0), torch.zeros(1)
        loss = loss * scale
    loss.backward()
    start = log.clock
    if scaled:
        grads = [p.grad for p in net.parameters() if p.grad is not None]
        torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, scale.reciprocal())
    optimizer.step()
    if scaled:
        torch._amp_update_scale_(scale, torch.zeros(1, dtype=torch.int32), found_inf, 2.0, 0.5, 2000)
    log.region(f"Optimizer.step#{type(optimizer).__name__}.step", start)


def capture(model: str, batch: int, precision: str, channels_last: bool = False) -> dict:
    """The Chrome trace of one training step of `model` at `batch` in `precision` ('fp32', 'amp_fp16' or
    'amp_bf16'), on fake tensors."""
    dtype = {"amp_fp16": torch.float16, "amp_bf16": torch.bfloat16}.get(precision)
    with FakeTensorMode(allow_non_fake_inputs=True):
        net, inputs, loss_fn, opt_class, opt_kwargs = build(model, batch, channels_last)
        optimizer = opt_class(net.parameters(), **opt_kwargs)
        for param in net.parameters():  # the optimizer's state as after a first step: a steady-state step is logged
            param.grad = torch.zeros_like(param)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        log = OpLog()
        with log:
            with CudaAutocastFp32(), torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
                loss = loss_fn(net(*inputs))
            _backward_and_step(loss, net, optimizer, log, scaled=precision == "amp_fp16")
    log.events.insert(0, {"ph": "X", "cat": "user_annotation", "name": "amp_bench::step", "pid": 1, "tid": 1, "ts": 0,
                          "dur": log.clock + 10})
    return {"traceEvents": log.events}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", choices=["resnet50", "bert_base_squad", "bert_large_squad",
                                          "bert_large_pretrain_128", "bert_large_pretrain_512"])
    parser.add_argument("batch", type=int)
    parser.add_argument("precision", choices=["fp32", "amp_fp16", "amp_bf16"])
    parser.add_argument("--channels-last", action="store_true")
    parser.add_argument("-o", "--output", type=Path, required=True)
    args = parser.parse_args()
    trace = capture(args.model, args.batch, args.precision, args.channels_last)
    with gzip.open(args.output, "wt", encoding="utf-8") as fh:
        json.dump(trace, fh)
    print(f"{args.output}: {len(trace['traceEvents'])} events")


if __name__ == "__main__":
    main()
