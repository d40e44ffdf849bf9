"""The parts of a torch.profiler (Kineto) Chrome trace that every reader shares: loading it, CPU
events nested per thread, the steps a trace holds, phases and the Profile / StepTimes a reading
produces; torch-free. trace.py reads CPU steps and dispatches, gpu_trace.py reads GPU ones.
Written by hand for the reasons trace.py gives.
"""
from __future__ import annotations

import bisect
import gzip
import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from amp_bench.analysis.explain.categories import CATEGORIES, COMPILED_GRAPH, classify_op
from amp_bench.errors import UserError

STEP_REGION = "amp_bench::step"
PHASE_PREFIX = "amp_bench::"  # amp_bench::forward / backward / optimizer, marked by profile.py
PROFILER_STEP = "ProfilerStep#"
PHASES = ("forward", "backward", "optimizer", "scaler", "other")
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
CPU_CATS = ("cpu_op", "user_annotation")
CLASSIFIED_CATS = ("cpu_op",) + GPU_CATS  # what lands in a category; annotations only mark regions
# Kineto's categories before PyTorch 1.10 (HTA's trace_file_list/inference_rank_1 has Kernel and
# Runtime): read as today's names, so an older trace is not taken for an empty CPU one
LEGACY_CATS = {"kernel": "kernel", "memcpy": "gpu_memcpy", "memset": "gpu_memset", "runtime": "cuda_runtime",
               "driver": "cuda_driver", "operator": "cpu_op", "user annotation": "user_annotation"}
_GEMM_CONV_OPS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_scaled_mm",
                  "aten::convolution"}  # the dispatcher's entry points, not their backend duplicates


class NoGpuActivity(ValueError):
    """A CUDA trace whose steps hold no kernel, memcpy or memset: CUPTI recorded nothing."""


class EmptyTrace(UserError):
    """A trace with no event a category can hold: nothing to explain, said in one line."""


@dataclass
class StepTimes:
    """One step's wall time, busy time and time per category (ms)."""
    wall_ms: float
    busy_ms: float
    categories_ms: dict[str, float]

    @property
    def host_ms(self) -> float:
        return max(self.wall_ms - self.busy_ms, 0.0)


@dataclass
class Profile:
    """The profiled steps of one trace. wall, busy and category figures are the medians over steps."""
    device_type: str
    wall_ms: float
    busy_ms: float
    categories_ms: dict[str, float]
    phases_ms: dict[str, float] = field(default_factory=dict)
    shapes: list[dict] = field(default_factory=list)
    trace_path: str | None = None
    notes: list[str] = field(default_factory=list)
    steps: list[StepTimes] = field(default_factory=list)
    kinds_ms: dict[str, float] = field(default_factory=dict)  # CUDA: busy time per HTA kernel kind
    gpu_span_ms: float | None = None  # CUDA: first kernel start to last kernel end
    gpu_busy_ms: float | None = None  # CUDA: the union of every kept kernel
    gpu_events: int = 0  # CUDA: how many kernels, memcpys and memsets were counted
    tensor_cores: dict | None = None  # CUDA: kernels.tensor_core_summary of the GEMM+conv kernels
    device_name: str = ""
    math_ms: dict[str, float] = field(default_factory=dict)  # GEMM+conv time by number format (fp32, bf16, ...)
    kernel_set: frozenset = frozenset()  # what the model ran besides GEMM/conv/casts, formats blanked

    @property
    def host_ms(self) -> float:
        return max(self.wall_ms - self.busy_ms, 0.0)

    @property
    def idle_share(self) -> float | None:
        """Idle (host) time over the step it is part of, categories + host: the one share of idle a reader
        of explain sees, in its tables and its sentence."""
        step = self.categories_sum_ms + self.host_ms
        return self.host_ms / step if step else None

    @property
    def gpu_idle_ms(self) -> float | None:
        return None if self.gpu_span_ms is None else max(self.gpu_span_ms - (self.gpu_busy_ms or 0.0), 0.0)

    @property
    def categories_sum_ms(self) -> float:
        return sum(self.categories_ms.values())

    def share(self, category: str) -> float | None:
        total = self.categories_sum_ms
        return self.categories_ms.get(category, 0.0) / total if total else None

    def samples(self) -> dict[str, list[float]]:
        """Per step: {category: [ms, ...], 'host': [...], 'wall': [...]}, what the noise rule reads."""
        return {**{c: [s.categories_ms.get(c, 0.0) for s in self.steps] for c in CATEGORIES},
                "host": [s.host_ms for s in self.steps], "wall": [s.wall_ms for s in self.steps]}

    def table(self) -> list[dict]:
        """Rows (category, ms, share of the categories' sum) plus the host time, for printing or CSV."""
        rows = [{"category": c, "ms": self.categories_ms.get(c, 0.0), "share": self.share(c)} for c in CATEGORIES]
        rows.append({"category": "host", "ms": self.host_ms, "share": None})
        return rows


def from_steps(device_type: str, steps: list[StepTimes], **extra) -> Profile:
    """A Profile whose figures are the per-step medians."""
    median = (lambda values: statistics.median(values) if values else 0.0)
    categories = {c: median([s.categories_ms.get(c, 0.0) for s in steps]) for c in CATEGORIES}
    return Profile(device_type, median([s.wall_ms for s in steps]), median([s.busy_ms for s in steps]),
                   categories, steps=steps, **extra)


def load_trace(source) -> dict:
    """A Chrome trace as a dict: a path (.json or .json.gz) or the dict itself. A missing or
    unreadable file, or one that is not a trace, is a one-line UserError naming it."""
    if isinstance(source, dict):
        return source
    path = Path(source)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as fh:
            trace = json.load(fh)
    except FileNotFoundError:
        raise UserError(f"{path}: no such trace file") from None
    except (OSError, ValueError, EOFError) as exc:
        raise UserError(f"{path}: not a readable JSON trace ({type(exc).__name__})") from None
    if isinstance(trace, list):  # the bare-array form of the Chrome trace format
        trace = {"traceEvents": trace}
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise UserError(f"{path}: not a Chrome / Kineto trace (no traceEvents list)")
    return _modern_categories(trace)


def _modern_categories(trace: dict) -> dict:
    """The trace with older Kineto's capitalised categories renamed (a copy; today's traces as they are)."""
    events = trace["traceEvents"]
    old = [i for i, e in enumerate(events) if isinstance(e, dict) and isinstance(e.get("cat"), str)
           and e["cat"] not in LEGACY_CATS.values() and e["cat"].lower() in LEGACY_CATS]
    if not old:
        return trace
    events = list(events)
    for i in old:
        events[i] = {**events[i], "cat": LEGACY_CATS[events[i]["cat"].lower()]}
    return {**trace, "traceEvents": events}


def timed_events(trace: dict, label: str) -> list[dict]:
    """The complete ('X') events of a trace; EmptyTrace when none of them is an op or a GPU event,
    so an empty trace, or one of only metadata, is refused rather than explained as zeros."""
    events = [e for e in trace.get("traceEvents", []) if isinstance(e, dict) and e.get("ph") == "X" and "ts" in e]
    if not any(e.get("cat") in CLASSIFIED_CATS for e in events):
        raise EmptyTrace(f"{label}: nothing to explain: no CPU op ({CLASSIFIED_CATS[0]}) and no GPU kernel, memcpy "
                         f"or memset among its {len(trace.get('traceEvents', []))} events")
    return events


@dataclass
class EventNode:
    event: dict
    start: float
    end: float
    parent: EventNode | None = None
    children: list = field(default_factory=list)
    # set by nest_events: walking the ancestors for every op of every step was most of reading a trace
    in_optimizer: bool = False  # under an Optimizer.* region
    in_op: bool = False  # under a cpu_op

    @property
    def name(self) -> str:
        return self.event.get("name", "")

    def ancestors(self):
        node = self.parent
        while node is not None:
            yield node
            node = node.parent


def nest_events(events: list[dict]) -> list[EventNode]:
    """CPU events (ops and annotations) nested per thread by time containment; returns every node."""
    by_thread: dict = {}
    for e in events:
        by_thread.setdefault((e.get("pid"), e.get("tid")), []).append(e)
    nodes: list[EventNode] = []
    for thread_events in by_thread.values():
        thread_events.sort(key=lambda e: (float(e["ts"]), -float(e.get("dur", 0))))
        stack: list[EventNode] = []
        for e in thread_events:
            start = float(e["ts"])
            node = EventNode(e, start, start + float(e.get("dur", 0)))
            while stack and start >= stack[-1].end - 1e-3:
                stack.pop()
            if stack:
                parent = node.parent = stack[-1]
                node.end = min(node.end, parent.end)  # a child never outlives its parent (rounding)
                node.in_optimizer = parent.in_optimizer or _is_optimizer_region(parent)
                node.in_op = parent.in_op or parent.event.get("cat") == "cpu_op"
                parent.children.append(node)
            stack.append(node)
            nodes.append(node)
    return nodes


def _self_time(node: EventNode) -> float:
    return max(node.end - node.start - sum(c.end - c.start for c in node.children), 0.0)


def union(intervals: list[tuple[float, float]]) -> float:
    """The time the intervals cover together (overlaps counted once)."""
    total, cur_start, cur_end = 0.0, None, None
    for start, end in sorted(intervals):
        if cur_end is None or start > cur_end:
            if cur_end is not None:
                total += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    return total + (cur_end - cur_start if cur_end is not None else 0.0)


def _is_optimizer_region(node: EventNode) -> bool:
    return node.name.startswith("Optimizer.")


def under_optimizer(node: EventNode) -> bool:
    return node.in_optimizer


def _counted_annotation(node: EventNode) -> bool:
    """A region whose own time is work, not host time: Inductor's `## Call CompiledFxGraph ... ##`
    (its generated kernels run there) and any region nested inside an op."""
    return node.name.startswith(COMPILED_GRAPH) or node.in_op


def _op_category(node: EventNode) -> str:
    """A CPU op's category; `aten::to`/`aten::_to_copy` follow their copy child (cast or layout)."""
    args = node.event.get("args") or {}
    if node.name in ("aten::to", "aten::_to_copy") and not under_optimizer(node):
        return next((classify_op(child.name, (child.event.get("args") or {}).get("Input type"))
                     for child in _descendants(node) if child.name == "aten::copy_"), "cast")
    return classify_op(node.name, args.get("Input type"), under_optimizer(node))


def _descendants(node: EventNode):
    for child in node.children:
        yield child
        yield from _descendants(child)


class _Phases:
    """Which phase a moment of the step belongs to, from the amp_bench::<phase> regions."""

    def __init__(self, nodes: list[EventNode]):
        regions = sorted((n.start, n.end, n.name[len(PHASE_PREFIX):]) for n in nodes if n.name != STEP_REGION
                         and n.event.get("cat") == "user_annotation" and n.name.startswith(PHASE_PREFIX))
        self.starts = [r[0] for r in regions]
        self.regions = regions

    def at(self, ts: float) -> str:
        i = bisect.bisect_right(self.starts, ts) - 1
        return self.regions[i][2] if i >= 0 and ts < self.regions[i][1] else "other"

    def wall(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for start, end, name in self.regions:
            out[name] = out.get(name, 0.0) + (end - start) / 1e3
        return out


def _phase_of(node: EventNode, phases: _Phases) -> str:
    phase = phases.at(node.start)
    if under_optimizer(node) or _is_optimizer_region(node):
        return "optimizer"
    if phase == "optimizer":  # after the optimizer mark but outside Optimizer.step: GradScaler's work
        return "scaler"
    return phase if phase in PHASES else "other"


def _shapes(nodes: list[EventNode]) -> list[dict]:
    """Recorded input shapes of the GEMM and convolution ops, counted per distinct (op, dims, types)."""
    seen: dict = {}
    for n in nodes:
        if n.name in _GEMM_CONV_OPS:
            args = n.event.get("args") or {}
            dims = args.get("Input Dims")
            if not dims:
                continue
            key = (n.name, json.dumps(dims), json.dumps(args.get("Input type")))
            seen.setdefault(key, {"op": n.name, "dims": dims, "types": args.get("Input type"), "count": 0})
            seen[key]["count"] += 1
    return list(seen.values())


@dataclass
class Windows:
    """The steps of a trace: (start, end) each in time order, how they were found, and `cutoff`: the
    start of a last ProfilerStep left out (GPU work launched from then on is not counted), else None."""
    steps: list[tuple[float, float]]
    notes: list[str]
    cutoff: float | None = None
    whole_trace: bool = False


def step_windows(nodes: list[EventNode]) -> Windows:
    ours = sorted((n.start, n.end) for n in nodes if n.name == STEP_REGION)
    if ours:
        return Windows(ours, [])
    marked = sorted((n.start, n.end) for n in nodes if n.name.startswith(PROFILER_STEP) and n.parent is None)
    if len(marked) >= 2:
        return Windows(marked[:-1], [f"{len(marked) - 1} ProfilerStep regions read; the last one is left out (the "
                                     "profiler stops inside it), as Holistic Trace Analysis does"], marked[-1][0])
    if marked:
        return Windows(marked, [])
    tops = [n for n in nodes if n.parent is None]
    if not tops:
        return Windows([], ["the trace holds no CPU events"], whole_trace=True)
    return Windows([(min(n.start for n in tops), max(n.end for n in tops))],
                   [f"no {STEP_REGION} or ProfilerStep region: the whole trace is one step"], whole_trace=True)


def within(nodes: list[EventNode], start: float, end: float) -> list[EventNode]:
    return [n for n in nodes if n.start >= start - 1e-3 and n.end <= end + 1e-3]


def per_step_phases(phase_ms: dict, phases: _Phases, steps: int) -> dict:
    """Phase times summed over the steps -> per step, with each marked phase's wall time."""
    steps = max(steps, 1)
    return {**{p: v / steps for p, v in phase_ms.items()}, **{f"{k}_wall": v / steps for k, v in phases.wall().items()}}
