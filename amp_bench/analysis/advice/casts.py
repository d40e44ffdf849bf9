"""A profiled step's casts between float formats, read from its trace's CPU ops (a CPU trace, or a GPU trace's
CPU side with each cast's kernels), for the casts rule (rules.casts). Torch-free.

Whose cast it is, from where it sits in the op tree:
- autocast's own: a cast inside the op autocast wraps (the `aten::to` under `aten::linear`, `aten::conv2d`,
  `aten::layer_norm`, ...): a lower-precision op's weight and input, an fp32-list op's input; the weight casts
  are cached, once per weight per autocast region. In the backward, each forward cast's gradient is cast back
  (under `ToCopyBackward0`). Autocast's price for keeping fp32 master weights: never advice in itself.
- the model's own code: a cast at the top of the forward, inside no op (`x.float()`, `w.to(torch.bfloat16)`).
A cast is the outermost `aten::to` / `aten::_to_copy` with a dtype-changing `aten::copy_` under it (its source
and target formats are that copy's recorded input types: record_shapes); `aten::to` to the tensor's own dtype
copies nothing and is not one. Its time: the op's on a CPU, the kernels it launched on a GPU.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path

from amp_bench.analysis.explain import events as ev

FORMATS = {"float": "fp32", "c10::BFloat16": "bf16", "c10::Half": "fp16"}
LOWER = ("bf16", "fp16")
_CAST_OPS = ("aten::to", "aten::_to_copy")
# the ops a module's weight enters as their second input (an addmm takes it transposed, so it is not read)
_WEIGHT_OPS = ("aten::linear", "aten::conv1d", "aten::conv2d", "aten::conv3d", "aten::convolution")


@dataclass
class Cast:
    step: int
    start: float  # µs, the trace's clock
    ms: float
    shape: tuple
    source: str  # fp32, bf16, fp16
    target: str
    explicit: bool  # the model's own code (inside no op), not autocast's
    backward: bool  # a gradient's cast in the backward pass

    @property
    def up(self) -> bool:
        return self.source in LOWER and self.target == "fp32"

    @property
    def down(self) -> bool:
        return self.source == "fp32" and self.target in LOWER


@dataclass
class CastReading:
    steps: int
    casts: list[Cast] = field(default_factory=list)
    weight_shapes: set = field(default_factory=set)  # the weights' shapes the step's GEMM/conv ops took
    ops_ms: dict = field(default_factory=dict)  # step -> [(start, end, ms)] of the forward's top-level ops


def _copy_types(node: ev.EventNode) -> tuple[str, str] | None:
    """(source, target) float formats of the dtype-changing copy under a cast op; None where it copies within a
    format or the types were not recorded."""
    stack = list(node.children)
    while stack:
        child = stack.pop()
        if child.name == "aten::copy_":
            types = (child.event.get("args") or {}).get("Input type") or []
            target, source = (FORMATS.get(t) if isinstance(t, str) else None for t in (types + [None, None])[:2])
            return (source, target) if source and target and source != target else None
        stack.extend(child.children)
    return None


def _is_backward(node: ev.EventNode) -> bool:
    return any(a.name.startswith("autograd::engine::evaluate_function") or a.name.endswith("Backward0")
               for a in node.ancestors())


def _kernel_ms(node: ev.EventNode, kernels: dict) -> float:
    """A GPU cast's time: the kernels its runtime launches under it started (by correlation id)."""
    total, stack = 0.0, list(node.children)
    while stack:
        child = stack.pop()
        correlation = (child.event.get("args") or {}).get("correlation")
        total += kernels.get(correlation, 0.0)
        stack.extend(child.children)
    return total


def read_casts(source) -> CastReading | None:
    """The casts of every step of a trace (a path or a dict); None where its ops carry no recorded types.
    A file is read once a process while unchanged (a run's advice is asked for up to four times: its lines,
    the report, the try; reading the trace is most of it). The reading is not to be changed."""
    if isinstance(source, dict) or not Path(source).is_file():
        return _read(source)  # a missing file: load_trace's one line
    return _read_file(str(Path(source).resolve()), Path(source).stat().st_mtime_ns)


@functools.lru_cache(maxsize=32)
def _read_file(path: str, mtime_ns: int) -> CastReading | None:
    return _read(path)


def _read(source) -> CastReading | None:
    trace = ev.load_trace(source)
    events = [e for e in trace.get("traceEvents", []) if isinstance(e, dict) and e.get("ph") == "X" and "ts" in e]
    kernels: dict = {}
    for e in events:
        if e.get("cat") in ev.GPU_CATS:
            correlation = (e.get("args") or {}).get("correlation")
            kernels[correlation] = kernels.get(correlation, 0.0) + float(e.get("dur", 0) or 0) / 1e3
    nodes = ev.nest_events([e for e in events if e.get("cat") in ev.CPU_CATS + ("cuda_runtime", "cuda_driver")])
    if not any("Input type" in (n.event.get("args") or {}) for n in nodes):
        return None
    windows = ev.step_windows([n for n in nodes if n.event.get("cat") in ev.CPU_CATS])
    reading = CastReading(max(1, len(windows.steps)))
    for index, (start, end) in enumerate(windows.steps):
        for node in ev.within(nodes, start, end):
            _read_node(node, index, reading, kernels)
    return reading


def _read_node(node: ev.EventNode, step: int, reading: CastReading, kernels: dict) -> None:
    args = node.event.get("args") or {}
    if node.name in _WEIGHT_OPS:
        dims = args.get("Input Dims") or []
        weight = dims[1] if len(dims) > 1 else None
        if isinstance(weight, list) and len(weight) >= 2:
            reading.weight_shapes.add(tuple(weight))
    if node.event.get("cat") == "cpu_op" and not node.in_op and not _is_backward(node):
        reading.ops_ms.setdefault(step, []).append((node.start, node.end, (node.end - node.start) / 1e3))
    if node.name not in _CAST_OPS:
        return  # not a cast
    in_op = [a for a in node.ancestors() if a.event.get("cat") == "cpu_op"]
    if any(a.name in _CAST_OPS for a in in_op[:1]):
        return  # the inner op of one (aten::to's own _to_copy)
    formats = _copy_types(node)
    dims = (args.get("Input Dims") or [[]])[0]
    if formats is None or not isinstance(dims, list):
        return
    ms = _kernel_ms(node, kernels) if kernels else (node.end - node.start) / 1e3
    reading.casts.append(Cast(step, node.start, ms, tuple(dims), *formats, explicit=not in_op,
                              backward=_is_backward(node)))
