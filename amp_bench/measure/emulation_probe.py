"""How much slower a mode the CPU only emulates would be, measured: the model's largest convolution or linear
layer (by FLOPs, its shapes found on fake tensors) timed forward and backward in fp32 and under the mode's
autocast, here, within a budget of a few seconds in all. The gate does not run an emulated mode; this is
what its row then says instead of a guess ("bf16 autocast here: its largest convolution ran 37x slower").

Why one layer: a whole emulated step can take minutes (ResNet-50 bs 8 in emulated bf16: ~23 s a step on an
AVX2 EPYC); the largest GEMM or convolution is where autocast's time goes, and its ratio is what emulation
costs. The layer is built afresh from the model's layer's settings (no weights to copy), and its batch is
cut where the emulated call would not fit the budget (the ratio barely depends on the batch).
"""
from __future__ import annotations

import time

import torch
from torch import nn

from amp_bench import modes

KINDS = {nn.Conv1d: "convolution", nn.Conv2d: "convolution", nn.Conv3d: "convolution", nn.Linear: "linear layer"}
WORST_CASE = 100.0  # the slowdown the batch is cut for, so one emulated call stays inside its budget


def _flops(module: nn.Module, x: torch.Tensor, out_shape: torch.Size) -> float:
    """A layer's FLOPs in a training step: forward, the weight's gradient, and the input's where the input
    needs one (a stem convolution on the data does not)."""
    if isinstance(module, nn.Linear):
        forward = 2.0 * module.in_features * module.out_features * float(torch.Size(x.shape[:-1]).numel())
    else:
        forward = 2.0 * module.in_channels // module.groups * float(torch.Size(module.kernel_size).numel()) * \
            float(out_shape.numel())
    return forward * (3.0 if x.requires_grad else 2.0)


def largest_layer(case) -> tuple[str, nn.Module, torch.Size, bool] | None:
    """(name, layer, input shape, whether its input needs a gradient) of the convolution or linear layer with
    the most FLOPs in a training step of the case's model at its batch, found on fake tensors (no compute);
    None when the model has neither."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from amp_bench.measure.models import build_workload, forward
    seen: dict[str, tuple[float, nn.Module, torch.Size, bool]] = {}

    def hook(name):
        def record(module, args, output):
            flops = _flops(module, args[0], output.shape)
            if flops > seen.get(name, (0.0,))[0]:
                seen[name] = (flops, module, args[0].shape, args[0].requires_grad)
        return record
    with FakeTensorMode(allow_non_fake_inputs=True):
        workload = build_workload(case.model.__dict__, image_size=case.image_size, seq_len=case.seq_len,
                                  channels_last=False, search_dirs=case.search_dirs)
        inputs, _ = workload.make_batch(case.batch_size, torch.device("cpu"))
        for name, module in workload.model.named_modules():
            if type(module) in KINDS:
                module.register_forward_hook(hook(name))
        forward(workload.model, inputs)
    if not seen:
        return None
    name, (_, module, shape, input_grad) = max(seen.items(), key=lambda item: item[1][0])
    return name, module, shape, input_grad


def _fresh(module: nn.Module) -> nn.Module:
    """A new layer with the same settings (the model's own may hold fake or large weights)."""
    if isinstance(module, nn.Linear):
        return nn.Linear(module.in_features, module.out_features, bias=module.bias is not None)
    return type(module)(module.in_channels, module.out_channels, module.kernel_size, stride=module.stride,
                        padding=module.padding, dilation=module.dilation, groups=module.groups,
                        bias=module.bias is not None)


def _seconds(layer: nn.Module, shape, dtype: torch.dtype | None, calls: int, channels_last: bool = False,
             input_grad: bool = True) -> float:
    """The median seconds of forward + backward of `layer` on a random batch, after one untimed call."""
    x = torch.randn(shape)
    if channels_last and x.dim() == 4:
        x = x.contiguous(memory_format=torch.channels_last)
    x.requires_grad_(input_grad)
    times = []
    for _ in range(calls + 1):
        started = time.perf_counter()
        with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            out = layer(x)
        out.float().sum().backward()
        times.append(time.perf_counter() - started)
    return sorted(times[1:])[len(times[1:]) // 2]


def describe(name: str, module: nn.Module, shape) -> str:
    if isinstance(module, nn.Linear):
        return f"{name}, {module.in_features}->{module.out_features} on {list(shape)}"
    kernel = "x".join(str(k) for k in module.kernel_size)
    return f"{name}, {module.in_channels}->{module.out_channels} {kernel} on {list(shape)}"


def slowdowns(layer_found, precisions: list[str], budget_s: float, channels_last: bool = False) -> dict[str, dict]:
    """{precision: {factor, kind, layer}}: the emulated mode's forward + backward time over fp32's on the
    largest layer (in the case's layout); fp32 first, then the modes share what is left of the budget."""
    name, module, shape, input_grad = layer_found
    layer, started = _fresh(module), time.perf_counter()
    if channels_last and isinstance(module, nn.Conv2d):
        layer = layer.to(memory_format=torch.channels_last)
    fp32 = _seconds(layer, shape, None, 3, channels_last, input_grad)
    share = max(budget_s - (time.perf_counter() - started), 0.1) / max(len(precisions), 1)
    batch = max(1, min(shape[0], int(shape[0] * share / (fp32 * WORST_CASE * 2))))  # an untimed call and one timed
    small = (batch, *shape[1:])
    base = fp32 if batch == shape[0] else _seconds(layer, small, None, 3, channels_last, input_grad)
    out = {}
    for precision in precisions:
        dtype = getattr(torch, modes.get(precision).autocast_dtype or "bfloat16")
        out[precision] = {"factor": _seconds(layer, small, dtype, 1, channels_last, input_grad) / base,
                          "kind": KINDS[type(module)], "layer": describe(name, module, small)}
    return out
