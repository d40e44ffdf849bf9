"""After the profiled steps, a few seconds more: the step's distinct layer shapes timed forward and backward on
this device as they run now and as an advised change would run them, so advice (analysis/advice) prices both
sides of a change from measurements instead of from what it removes alone. This module only measures; the
rules read what it saves beside the trace (STEM.probe.json, stats.probe_path), torch-free.

The changes probed, each only where its rule could fire:
- `channels_last` (a case in NCHW with 4-D convolutions): every distinct leaf module that took one 4-D image
  (its class and configuration, input shape and dtype: convolutions, norms over channels, activations,
  pooling; not a Linear or LayerNorm on a permuted 4-D tensor) in the current layout and in channels_last.
  That holds what NHWC removes (oneDNN's or cuDNN's reorders around each convolution) and what it costs
  (convolutions whose channel counts fit the blocked layout better, depthwise ones, norms and pooling with
  slower NHWC kernels).
- `optimizer_impl` (a for-loop or foreach SGD, Adam or AdamW): one update of tensors shaped as the model's
  parameters, in the current implementation and fused.
- `pad_dims` (a GPU: linear layers whose dimensions are not multiples of 8): each such layer as it is and padded.

Bounded: BUDGET_STEPS measured steps of time, between MIN_S and MAX_S, spent in rounds (Probe.timed): every
shape gets a timed pair before any gets a second, up to REPEATS; a side's figure is its fastest run. A shape the
budget left without a pair is listed as untimed, with its calls and its work (the rules price it at its kind's
timed rate). Never raises: a failure saves nothing.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import itertools
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

MIN_S, MAX_S = 1.5, 6.0  # the probe's budget, whatever the step
BUDGET_STEPS = 6  # ... of this many measured steps in between
REPEATS = 3  # timed pairs per shape at most
PADDED_MULTIPLE = 64  # a padded GEMM dimension (a vocabulary padded to 64, as nanoGPT's 50304)


@dataclass
class Shape:
    """One distinct shape of the step, its calls per step and an estimate of its work (the order the shapes are
    timed in, largest first), and how to build its two sides: `build()` -> (run now, run changed), each running
    it once and returning when the device is done. Built when timed and dropped after, so one shape's tensors
    are alive at a time."""
    label: str
    kind: str  # conv, norm, activation, pool, linear, optimizer, other
    calls: int
    work: float
    build: object
    now_ms: float | None = None  # each side's fastest timed run
    changed_ms: float | None = None
    pairs: int = 0
    failed: str = ""

    def record(self, now_ms: float, changed_ms: float) -> None:
        """One timed pair: each side keeps its fastest run (another process only adds time)."""
        self.now_ms = now_ms if self.now_ms is None else min(self.now_ms, now_ms)
        self.changed_ms = changed_ms if self.changed_ms is None else min(self.changed_ms, changed_ms)
        self.pairs += 1

    def reading(self) -> dict:
        return {"label": self.label, "kind": self.kind, "calls": self.calls, "work": self.work, "now_ms": self.now_ms,
                "changed_ms": self.changed_ms, "pairs": self.pairs}


@dataclass
class Probe:
    """The shapes of each change, timed within `budget_s` by `clock` (seconds)."""
    budget_s: float
    clock: object = time.perf_counter
    changes: dict[str, list[Shape]] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)

    def timed(self) -> float:
        """Every shape once before any shape twice, while the budget lasts: round one runs each side once untimed
        first (the changed side's kernels are built, JIT-compiled or autotuned on its first run, which the step
        already paid for the current side; an optimizer makes its state), then a timed pair; each later round adds
        a pair, which side first alternating, up to REPEATS. Its order: the changes with fewest shapes first (the
        optimizer's one update never waits behind a CNN's layers), then one shape of each kind in turn, each
        kind's largest first, so a budget cut leaves every kind timed. The seconds it took."""
        started = self.clock()
        order = self._order()
        for round_ in range(REPEATS):
            for shape in (s for s in order if s.pairs == round_ and not s.failed):
                if self.clock() - started > self.budget_s:
                    return self.clock() - started
                try:
                    now, changed = shape.build()
                    if round_ == 0:
                        now(), changed()
                    sides = (now, changed) if shape.pairs % 2 == 0 else (changed, now)
                    times = {id(side): self._once(side) for side in sides}
                    shape.record(times[id(now)], times[id(changed)])
                except Exception as exc:  # this shape alone: a module the copy or the layout does not suit
                    shape.failed, shape.pairs = f"{type(exc).__name__}: {exc}"[:200], 0
        return self.clock() - started

    def _order(self) -> list[Shape]:
        out = []
        for found in sorted(self.changes.values(), key=len):
            by_kind: dict[str, list[Shape]] = {}
            for shape in sorted(found, key=lambda s: -s.work * s.calls):
                by_kind.setdefault(shape.kind, []).append(shape)
            out += [shape for turn in itertools.zip_longest(*by_kind.values()) for shape in turn if shape]
        return out

    def _once(self, run) -> float:
        start = self.clock()
        run()
        return (self.clock() - start) * 1e3

    def readings(self, seconds: float, device_type: str) -> dict:
        out: dict = {"budget_s": round(self.budget_s, 3), "seconds": round(seconds, 3), "device_type": device_type,
                     "changes": {}, "failed": dict(self.failed)}
        for rule, shapes in self.changes.items():
            out["changes"][rule] = {"shapes": [s.reading() for s in shapes if s.pairs],
                                    "untimed": [{"label": s.label, "kind": s.kind, "calls": s.calls, "work": s.work,
                                                 **({"failed": s.failed} if s.failed else {})}
                                                for s in shapes if not s.pairs]}
        return out


def budget_s(median_ms: float | None) -> float:
    return min(MAX_S, max(MIN_S, BUDGET_STEPS * (median_ms or 0.0) / 1e3))


# --------------------------------------------------------------------------- the step's layers

_KINDS = (("conv", ("Conv",)), ("norm", ("Norm",)), ("pool", ("Pool",)),
          ("activation", ("ReLU", "SiLU", "GELU", "Hardswish", "Hardsigmoid", "Sigmoid", "Tanh", "Mish", "ELU")))


def kind_of(module) -> str:
    """conv, norm, pool, activation or other, by the module's class or a class it derives from."""
    names = " ".join(cls.__name__ for cls in type(module).__mro__[:-1])
    return next((kind for kind, words in _KINDS if any(word in names for word in words)), "other")


@dataclass
class Leaf:
    """A distinct (module configuration, input) of the forward: the first module seen with it and its calls."""
    name: str
    module: object
    shape: tuple
    dtype: object
    grad: bool  # the input needs a gradient (every layer's but the batch's own)
    out_numel: int
    calls: int = 1

    def work(self) -> float:
        """Its forward's multiply-adds for a convolution or a linear layer, else a few per element: the order
        the shapes are timed in."""
        weight = getattr(self.module, "weight", None)
        if kind_of(self.module) == "conv" and weight is not None and weight.dim() >= 3:
            return self.out_numel * weight[0].numel()
        if weight is not None and weight.dim() == 2:
            return self.out_numel * weight.shape[1]
        return 8.0 * max(self.out_numel, math.prod(self.shape))


def record_leaves(model, inputs, autocast) -> list[Leaf]:
    """Every distinct leaf module that took one floating tensor, in one forward without gradients."""
    import torch

    from amp_bench.measure.models import forward
    tensors = inputs.values() if isinstance(inputs, dict) else inputs if isinstance(inputs, (tuple, list)) else [inputs]
    batch = {t.data_ptr() for t in tensors if isinstance(t, torch.Tensor)}
    seen: dict = {}

    def hook(name):
        def record(module, args, output):
            x = args[0] if len(args) == 1 else None
            if not isinstance(x, torch.Tensor) or not x.is_floating_point() or not isinstance(output, torch.Tensor):
                return
            key = (type(module).__qualname__, repr(module), tuple(x.shape), x.dtype, x.data_ptr() in batch)
            if key in seen:
                seen[key].calls += 1
            else:
                seen[key] = Leaf(name, module, tuple(x.shape), x.dtype, x.data_ptr() not in batch, output.numel())
        return record

    handles = [module.register_forward_hook(hook(name)) for name, module in model.named_modules()
               if not list(module.children())]
    try:
        with torch.no_grad(), autocast():
            forward(model, inputs)
    finally:
        for handle in handles:
            handle.remove()
    return list(seen.values())


def _label(leaf: Leaf) -> str:
    text = " ".join(repr(leaf.module).split())
    shape = "x".join(str(d) for d in leaf.shape)
    return f"{leaf.name} {text[:90]} {shape} {str(leaf.dtype).replace('torch.', '')}"


def _fwd_bwd(module, x, autocast, sync):
    """Run the module forward (under the step's autocast) and backward once, as the step does."""
    import torch
    state: dict = {}

    def run():
        module.zero_grad(set_to_none=True)
        x.grad = None
        with autocast():
            y = module(x)
        if y.requires_grad:
            if "grad" not in state:
                state["grad"] = torch.ones_like(y)  # in the output's own layout
            y.backward(state["grad"])
        sync()
    return run


def _copy(leaf: Leaf, device, channels_last: bool):
    """The leaf's module and an input like its own, in either layout; in-place activations made out of place
    (a leaf input that needs a gradient cannot be written in place)."""
    import torch
    module = copy.deepcopy(leaf.module)
    for sub in module.modules():
        if getattr(sub, "inplace", False) is True:
            sub.inplace = False
    x = torch.rand(leaf.shape, device=device).sub_(0.5).to(leaf.dtype)
    if channels_last:
        module = module.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    return module, x.requires_grad_(leaf.grad)


_CHANNEL_NORMS = ("BatchNorm", "GroupNorm", "InstanceNorm", "LocalResponseNorm", "2d")


def takes_the_layout(leaf: Leaf) -> bool:
    """A leaf whose 4-D input is an image, channels second, so channels_last changes how it runs: convolutions,
    pooling, elementwise activations and the norms over channels. A Linear or a LayerNorm on a 4-D tensor runs
    on its last dimension (ConvNeXt's blocks permute to (N, H, W, C) first): in NHWC its input never takes the
    layout the probe would give it."""
    kind = kind_of(leaf.module)
    names = " ".join(cls.__name__ for cls in type(leaf.module).__mro__[:-1])
    return len(leaf.shape) == 4 and (kind in ("conv", "pool", "activation") or
                                     (kind == "norm" and any(word in names for word in _CHANNEL_NORMS)))


def layout_shapes(leaves: list[Leaf], device, autocast, sync) -> list[Shape]:
    """channels_last: each leaf that takes the layout, in NCHW (now) and in NHWC (changed)."""
    def build(leaf):
        return lambda: tuple(_fwd_bwd(*_copy(leaf, device, cl), autocast, sync) for cl in (False, True))
    return [Shape(_label(leaf), kind_of(leaf.module), leaf.calls, leaf.work(), build(leaf))
            for leaf in leaves if takes_the_layout(leaf)]


def padded_shapes(leaves: list[Leaf], device, autocast, sync, multiple: int = 8) -> list[Shape]:
    """pad_dims: each linear layer with a dimension not a multiple of `multiple`, as it is and padded (to
    PADDED_MULTIPLE)."""
    import torch

    def pad(size: int) -> int:
        return size if size % multiple == 0 else -(-size // PADDED_MULTIPLE) * PADDED_MULTIPLE

    def build(leaf, bias):
        def sides():
            runs, width, out = [], leaf.shape[-1], leaf.module.out_features
            for k, n in ((width, out), (pad(width), pad(out))):
                layer = torch.nn.Linear(k, n, bias=bias, device=device)
                x = torch.rand(*leaf.shape[:-1], k, device=device).to(leaf.dtype).requires_grad_(leaf.grad)
                runs.append(_fwd_bwd(layer, x, autocast, sync))
            return tuple(runs)
        return sides
    return [Shape(_label(leaf), "linear", leaf.calls, leaf.work(), build(leaf, leaf.module.bias is not None))
            for leaf in leaves if isinstance(leaf.module, torch.nn.Linear)
            and (leaf.module.in_features % multiple or leaf.module.out_features % multiple)]


def optimizer_shapes(model, spec, sync) -> list[Shape]:
    """optimizer_impl: one update of tensors shaped as the model's parameters, now and fused (copies: the
    model's own weights and optimizer state stay as they are)."""
    import torch

    from amp_bench.measure.step import build_optimizer
    params = [p for p in model.parameters() if p.requires_grad]

    def side(impl):
        copies = [p.detach().clone().requires_grad_() for p in params]
        for tensor in copies:
            tensor.grad = torch.randn_like(tensor).mul_(1e-3)
        optimizer = build_optimizer(copies, impl)

        def run():
            optimizer.step()
            sync()
        return run
    count = sum(p.numel() for p in params)
    return [Shape(f"{spec.impl} {spec.name} over {len(params)} tensors ({count} parameters)", "optimizer", 1,
                  float(count), lambda: (side(spec), side(dataclasses.replace(spec, impl="fused"))))]


def probe_step(step, inputs, case, ops, path, median_ms: float | None, clock=time.perf_counter) -> dict:
    """Probe what applies to this case on `ops`' device (measure/devices) and save the readings at `path` (JSON);
    returns them ({} where nothing applies). Never raises: a failed change is named in the readings' `failed`."""
    import torch

    from amp_bench import modes
    from amp_bench.measure.precision import autocast_region
    from amp_bench.measure.telemetry.profile import _eager_module
    module, _ = _eager_module(step.model)
    mode = modes.get(case.precision)
    autocast = (lambda: autocast_region(mode, ops.type))
    device, sync = ops.torch_device, ops.synchronize
    probe = Probe(budget_s(median_ms), clock)
    try:
        leaves = record_leaves(module, inputs, autocast)
    except Exception as exc:  # a forward the hooks cannot follow: nothing to probe
        return _save(path, {"failed": {"leaves": f"{type(exc).__name__}: {exc}"[:200]}})
    multiple = 16 if mode.float8_linear else 8  # fp8's GEMMs want multiples of 16
    conv = any(len(leaf.shape) == 4 and isinstance(leaf.module, torch.nn.Conv2d) for leaf in leaves)
    wanted = {"channels_last": (lambda: layout_shapes(leaves, device, autocast, sync))
              if conv and not case.channels_last else None,
              "optimizer_impl": (lambda: optimizer_shapes(module, case.optimizer, sync))
              if case.optimizer.impl in ("for-loop", "foreach") else None,
              "pad_dims": (lambda: padded_shapes(leaves, device, autocast, sync, multiple))
              if ops.padded_gemms_differ else None}
    for rule, build in wanted.items():
        if build is None:
            continue
        try:
            probe.changes[rule] = build()
        except Exception as exc:  # a change this torch cannot make here (a fused optimizer it lacks)
            probe.failed[rule] = f"{type(exc).__name__}: {exc}"[:200]
    if not probe.changes and not probe.failed:
        return {}
    try:
        seconds = probe.timed()
    except Exception as exc:
        return _save(path, {"failed": {"timing": f"{type(exc).__name__}: {exc}"[:200]}})
    return _save(path, probe.readings(seconds, ops.type))


def _save(path, readings: dict) -> dict:
    with contextlib.suppress(OSError):
        Path(path).write_text(json.dumps(readings, indent=1), encoding="utf-8")
    return readings
