"""Reading one profiled step out of a torch.profiler Chrome trace: time per category, per phase,
busy and host time, and the recorded GEMM/conv shapes; torch-free.

Why by hand: `prof.key_averages()` sums self times per op name across threads and has no notion of
the step's window, the phases we mark or the device being idle; Holistic Trace Analysis has nothing
on CPU traces and no categories finer than compute/memory/communication. Reading the trace itself
gives one code path for a trace just taken and one saved earlier (Perfetto opens the same file).

CPU (`device_type='cpu'`): each op's *self* time (its duration less its direct children's, per
thread), so nested ops are never counted twice; an op under the profiler's `Optimizer.step#...` or
`Optimizer.zero_grad#...` region is the optimizer's, and so is that region's own Python time. Busy
time is the union of the top-level intervals (ops and optimizer regions) over all threads; host time
is the step's wall time less busy time (Python and framework time between ops).
CUDA: kernel, memcpy and memset durations inside the step's window; busy time is the union of their
intervals (kernels on concurrent streams overlap, so categories can sum to more than busy time:
`overlap_ms` says by how much); host time is the window with no GPU activity (the device idle).
A kernel is the optimizer's when the CPU op that launched it ran under an optimizer region, and a
cast when that op was a dtype-changing copy (the launch is found through the trace's correlation id).
"""
from __future__ import annotations

import bisect
import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path

from amp_bench.analysis.explain.categories import CATEGORIES, COMPILED_GRAPH, classify_kernel, classify_op, copy_is_cast

STEP_REGION = "amp_bench::step"
PHASE_PREFIX = "amp_bench::"  # amp_bench::forward / backward / optimizer, marked by profile.py
PHASES = ("forward", "backward", "optimizer", "scaler", "other")
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
_GEMM_CONV_OPS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_scaled_mm",
                  "aten::convolution"}  # the dispatcher's entry points, not their backend duplicates


@dataclass
class Profile:
    """One profiled step, as read from its trace. Times in ms for this one step."""
    device_type: str
    wall_ms: float
    busy_ms: float
    categories_ms: dict[str, float]
    phases_ms: dict[str, float] = field(default_factory=dict)
    shapes: list[dict] = field(default_factory=list)
    trace_path: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def host_ms(self) -> float:
        return max(self.wall_ms - self.busy_ms, 0.0)

    @property
    def categories_sum_ms(self) -> float:
        return sum(self.categories_ms.values())

    @property
    def overlap_ms(self) -> float:
        """Category time beyond busy time: concurrent kernels (CUDA) or overlapping threads."""
        return self.categories_sum_ms - self.busy_ms

    def share(self, category: str) -> float | None:
        total = self.categories_sum_ms
        return self.categories_ms.get(category, 0.0) / total if total else None

    def table(self) -> list[dict]:
        """Rows (category, ms, share of the categories' sum) plus the host time, for printing or CSV."""
        total = self.categories_sum_ms
        rows = [{"category": c, "ms": self.categories_ms.get(c, 0.0),
                 "share": self.categories_ms.get(c, 0.0) / total if total else None} for c in CATEGORIES]
        rows.append({"category": "host", "ms": self.host_ms, "share": None})
        return rows


def load_trace(source) -> dict:
    """A Chrome trace as a dict: a path (.json or .json.gz) or the dict itself."""
    if isinstance(source, dict):
        return source
    path = Path(source)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        return json.load(fh)


@dataclass
class _Node:
    event: dict
    start: float
    end: float
    parent: "_Node | None" = None
    children: list = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.event.get("name", "")

    def ancestors(self):
        node = self.parent
        while node is not None:
            yield node
            node = node.parent


def _forest(events: list[dict]) -> list[_Node]:
    """CPU events (ops and annotations) nested per thread by time containment; returns every node."""
    by_thread: dict = {}
    for e in events:
        by_thread.setdefault((e.get("pid"), e.get("tid")), []).append(e)
    nodes: list[_Node] = []
    for thread_events in by_thread.values():
        thread_events.sort(key=lambda e: (float(e["ts"]), -float(e.get("dur", 0))))
        stack: list[_Node] = []
        for e in thread_events:
            start = float(e["ts"])
            node = _Node(e, start, start + float(e.get("dur", 0)))
            while stack and start >= stack[-1].end - 1e-3:
                stack.pop()
            if stack:
                node.parent = stack[-1]
                node.end = min(node.end, stack[-1].end)  # a child never outlives its parent (rounding)
                stack[-1].children.append(node)
            stack.append(node)
            nodes.append(node)
    return nodes


def _self_time(node: _Node) -> float:
    return max(node.end - node.start - sum(c.end - c.start for c in node.children), 0.0)


def _union(intervals: list[tuple[float, float]]) -> float:
    total, cur_start, cur_end = 0.0, None, None
    for start, end in sorted(intervals):
        if cur_end is None or start > cur_end:
            if cur_end is not None:
                total += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    return total + (cur_end - cur_start if cur_end is not None else 0.0)


def _is_optimizer_region(node: _Node) -> bool:
    return node.name.startswith("Optimizer.")


def _in_optimizer(node: _Node) -> bool:
    return any(_is_optimizer_region(a) for a in node.ancestors())


def _counted_annotation(node: _Node) -> bool:
    """A region whose own time is work, not host time: Inductor's `## Call CompiledFxGraph ... ##`
    (its generated kernels run there) and any region nested inside an op."""
    return node.name.startswith(COMPILED_GRAPH) or any(a.event.get("cat") == "cpu_op" for a in node.ancestors())


def _op_category(node: _Node) -> str:
    """A CPU op's category; `aten::to`/`aten::_to_copy` follow their copy child (cast or layout)."""
    args = node.event.get("args") or {}
    if node.name in ("aten::to", "aten::_to_copy") and not _in_optimizer(node):
        for child in _descendants(node):
            if child.name == "aten::copy_":
                return classify_op(child.name, (child.event.get("args") or {}).get("Input type"))
        return "cast"
    return classify_op(node.name, args.get("Input type"), _in_optimizer(node))


def _descendants(node: _Node):
    for child in node.children:
        yield child
        yield from _descendants(child)


class _Phases:
    """Which phase a moment of the step belongs to, from the amp_bench::<phase> regions."""

    def __init__(self, nodes: list[_Node]):
        regions = sorted((n.start, n.end, n.name[len(PHASE_PREFIX):]) for n in nodes
                         if n.event.get("cat") == "user_annotation" and n.name.startswith(PHASE_PREFIX)
                         and n.name != STEP_REGION)
        self.starts = [r[0] for r in regions]
        self.regions = regions

    def at(self, ts: float) -> str:
        i = bisect.bisect_right(self.starts, ts) - 1
        if i >= 0 and ts < self.regions[i][1]:
            return self.regions[i][2]
        return "other"

    def wall(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for start, end, name in self.regions:
            out[name] = out.get(name, 0.0) + (end - start) / 1e3
        return out


def _phase_of(node: _Node, phases: _Phases) -> str:
    phase = phases.at(node.start)
    if _in_optimizer(node) or _is_optimizer_region(node):
        return "optimizer"
    if phase == "optimizer":  # after the optimizer mark but outside Optimizer.step: GradScaler's work
        return "scaler"
    return phase if phase in PHASES else "other"


def _window(nodes: list[_Node]) -> tuple[float, float, list[str]]:
    steps = [n for n in nodes if n.name == STEP_REGION]
    if steps:
        step = max(steps, key=lambda n: n.end - n.start)
        return step.start, step.end, []
    ops = [n for n in nodes if n.parent is None]
    if not ops:
        return 0.0, 0.0, ["the trace holds no CPU events"]
    return min(n.start for n in ops), max(n.end for n in ops), [f"no {STEP_REGION} region: the whole trace is the step"]


def _shapes(nodes: list[_Node]) -> list[dict]:
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


def read_profile(source, device_type: str, trace_path: str | None = None) -> Profile:
    """The per-category breakdown of the one step in `source` (a trace dict or file)."""
    trace = load_trace(source)
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "ts" in e]
    cpu = [e for e in events if e.get("cat") in ("cpu_op", "user_annotation")]
    nodes = _forest(cpu)
    start, end, notes = _window(nodes)
    nodes = [n for n in nodes if n.start >= start - 1e-3 and n.end <= end + 1e-3]
    phases = _Phases(nodes)
    if device_type == "cuda":
        return _cuda_profile(events, nodes, phases, start, end, notes, trace_path)
    categories = {c: 0.0 for c in CATEGORIES}
    phase_ms = {p: 0.0 for p in PHASES}
    intervals = []
    for node in nodes:
        cat = node.event.get("cat")
        in_optimizer = _is_optimizer_region(node) or _in_optimizer(node)
        if cat == "user_annotation" and not in_optimizer and not _counted_annotation(node):
            continue  # our marks, the step region, ProfilerStep#: their own time is host time
        if not any(a.event.get("cat") == "cpu_op" or _is_optimizer_region(a) for a in node.ancestors()):
            intervals.append((node.start, node.end))  # a top-level op or optimizer region
        category = "optimizer" if in_optimizer else _op_category(node)
        ms = _self_time(node) / 1e3
        categories[category] += ms
        phase_ms[_phase_of(node, phases)] += ms
    return Profile("cpu", (end - start) / 1e3, _union(intervals) / 1e3, categories,
                   {**phase_ms, **{f"{k}_wall": v for k, v in phases.wall().items()}}, _shapes(nodes), trace_path, notes)


def _cuda_profile(events, nodes, phases, start, end, notes, trace_path) -> Profile:
    by_correlation = {}
    runtime = [e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")]
    launch_nodes = _forest([e for e in events if e.get("cat") in ("cpu_op", "user_annotation")] + runtime)
    for node in launch_nodes:
        if node.event.get("cat") in ("cuda_runtime", "cuda_driver"):
            corr = (node.event.get("args") or {}).get("correlation")
            if corr is not None:
                by_correlation[corr] = node
    categories = {c: 0.0 for c in CATEGORIES}
    phase_ms = {p: 0.0 for p in PHASES}
    intervals = []
    unlinked = 0
    for e in events:
        if e.get("cat") not in GPU_CATS:
            continue
        k_start, k_end = float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))
        if k_end < start or k_start > end:
            continue
        k_start, k_end = max(k_start, start), min(k_end, end)
        category = classify_kernel(e.get("name", ""))
        launch = by_correlation.get((e.get("args") or {}).get("correlation"))
        phase = "other"
        if launch is None:
            unlinked += 1
        else:
            ops = [a for a in launch.ancestors() if a.event.get("cat") == "cpu_op"]
            if any(_is_optimizer_region(a) for a in launch.ancestors()):
                category = "optimizer"
            elif category in ("layout", "elementwise") and any(
                    a.name == "aten::copy_" and copy_is_cast((a.event.get("args") or {}).get("Input type"))
                    for a in ops[:1]):
                category = "cast"  # the kernel's name hides the dtype change; its launching op shows it
            phase = _phase_of(launch, phases)
        ms = (k_end - k_start) / 1e3
        categories[category] += ms
        phase_ms[phase] += ms
        intervals.append((k_start, k_end))
    if unlinked:
        notes = notes + [f"{unlinked} GPU events without a launch in the trace: phase 'other', name rules only"]
    return Profile("cuda", (end - start) / 1e3, _union(intervals) / 1e3, categories,
                   {**phase_ms, **{f"{k}_wall": v for k, v in phases.wall().items()}}, _shapes(nodes), trace_path, notes)
