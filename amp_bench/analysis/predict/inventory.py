"""A profiled step as the pieces the scaling rules take (scaling.Work), read from the gzip Chrome trace
that `explain` keeps for each case (RUN_DIR/traces/*.json.gz); torch-free.

A GPU trace gives each kernel's time. Kernels are grouped by the op that launched them (found through
the trace's correlation ids), the outermost aten op that launches work, and that op's recorded shapes
give the FLOPs and bytes (ops.py). A kernel with no such op keeps its name's category and is scaled by
the peak or bandwidth ratio. The device's idle time in the step is one `host` piece.
A CPU trace gives an op inventory: the same outermost ops, their FLOPs, bytes and input types, but no
GPU time (the CPU's time says nothing of a GPU's), so the target's roofline prices them.

Why by hand: explain's reader (analysis/explain/trace.py) sums time per category and keeps no per-op
shapes; Holistic Trace Analysis has no shapes-to-FLOPs. The CPU events are nested by explain's
events.nest_events (time containment per thread), the one nesting both readers use.
"""
from __future__ import annotations

from collections import Counter
from math import prod

from amp_bench.analysis.explain import events
from amp_bench.analysis.explain.categories import classify_kernel, classify_op
from amp_bench.analysis.explain.events import GPU_CATS, STEP_REGION, EventNode, load_trace, nest_events, under_optimizer
from amp_bench.analysis.predict.ops import OpCost, is_costed, op_cost
from amp_bench.analysis.predict.scaling import HOST, HOST_COPY, Work


def _cost(node: EventNode) -> OpCost | None:
    args = node.event.get("args") or {}
    if not is_costed(node.name):
        return None
    return op_cost(node.name, args.get("Input Dims"), args.get("Input type"), args.get("Concrete Inputs"),
                   args.get("Input Strides"), args.get("TensorList type"))


def _costed_roots(nodes: list[EventNode]) -> dict[int, tuple[EventNode, OpCost]]:
    """id(event) -> (event, cost) for the outermost events that cost work: nothing under them counts."""
    out: dict[int, tuple[EventNode, OpCost]] = {}
    for node in nodes:  # parents come before their children
        ancestor = node.parent
        while ancestor is not None and id(ancestor) not in out:
            ancestor = ancestor.parent
        if ancestor is not None:
            continue
        cost = _cost(node)
        if cost is not None:
            out[id(node)] = (node, cost)
    return out


def _category(node: EventNode) -> str:
    return classify_op(node.name, (node.event.get("args") or {}).get("Input type"), under_optimizer(node))


def _window(nodes: list[EventNode]) -> tuple[float, float]:
    """The profiled step: amp_bench's step region, else the first ProfilerStep#N of a trace taken with
    torch.profiler's schedule, else the whole trace."""
    steps = [n for n in nodes if n.name == STEP_REGION] or \
        sorted((n for n in nodes if n.name.startswith("ProfilerStep#")), key=lambda n: n.start)[:1]
    if steps:
        step = max(steps, key=lambda n: n.end - n.start)
        return step.start, step.end
    tops = [n for n in nodes if n.parent is None] or nodes
    return (min(n.start for n in tops), max(n.end for n in tops)) if tops else (0.0, 0.0)


def _cpu_nodes(trace: dict) -> list[EventNode]:
    return nest_events([e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "ts" in e
                        and e.get("cat") in ("cpu_op", "user_annotation", "cuda_runtime", "cuda_driver")])


def inventory(source) -> list[Work]:
    """An op inventory from a CPU trace (or any trace's CPU side): one Work per outermost costed op, no time."""
    return priced_inventory(source)[0]


def _unpriced(step: list[EventNode], roots: dict) -> Counter:
    """The aten ops that launch work but got no cost, neither their own nor from an op under them or
    over them: what the inventory leaves out, by name."""
    inside_roots = set(roots)
    for node in step:  # parents come before their children
        if node.parent is not None and id(node.parent) in inside_roots:
            inside_roots.add(id(node))
    covered = set(inside_roots)
    for node in step:
        if id(node) in inside_roots:
            covered.update(id(a) for a in node.ancestors())
    return Counter(n.name for n in step if n.event.get("cat") == "cpu_op" and is_costed(n.name)
                   and id(n) not in covered)


def priced_inventory(source) -> tuple[list[Work], Counter]:
    """(the op inventory, the ops it could not price by name and count): a CPU trace's outermost costed
    ops, one Work each (a CPU's _foreach_ op's per-tensor children as one), no time."""
    nodes = _cpu_nodes(load_trace(source))
    start, end = _window(nodes)
    step = [n for n in nodes if start - 1e-3 <= n.start <= end + 1e-3]
    roots = _costed_roots(step)
    works: list[Work] = []
    foreach: dict[int, Work] = {}
    for node, cost in roots.values():
        group = next((a for a in node.ancestors() if a.name.startswith(("aten::_foreach_", "aten::_fused_"))), None)
        if group is None:
            works.append(Work(node.name, _category(node), None, cost.flops, cost.bytes, cost.math,
                              nchw_bytes=cost.nchw_bytes, misaligned=cost.misaligned))
        elif id(group) in foreach:
            foreach[id(group)].bytes += cost.bytes
        else:  # a CPU runs a _foreach_ op tensor by tensor; a GPU's multi_tensor_apply is one launch
            foreach[id(group)] = Work(group.name, "optimizer", None, 0.0, cost.bytes, None)
    return works + list(foreach.values()), _unpriced(step, roots)


def _launching_op(launch: EventNode | None, roots: dict) -> tuple[EventNode, OpCost] | None:
    if launch is None:
        return None
    return next((roots[id(n)] for n in (launch, *launch.ancestors()) if id(n) in roots), None)


def _blocks(event: dict) -> int | None:
    grid = (event.get("args") or {}).get("grid")
    return prod(int(g) for g in grid) if isinstance(grid, list) and grid else None


def _kernel_work(event: dict, ms: float) -> Work:
    name = event.get("name", "")
    moved = float((event.get("args") or {}).get("bytes") or 0.0) if event.get("cat") == "gpu_memcpy" else 0.0
    if "htod" in name.lower() or "dtoh" in name.lower():  # a host link's copy: the GPU does not set its pace
        return Work(name, HOST_COPY, ms)
    return Work(name, classify_kernel(name), ms, 0.0, moved, None, _blocks(event))


def gpu_works(source) -> tuple[list[Work], float, float]:
    """(works, busy ms, wall ms) of the one step in a GPU trace: one Work per launching op (its kernels'
    summed time, its FLOPs and bytes), one per kernel with no costed op, and the idle time as `host`."""
    trace = load_trace(source)
    nodes = _cpu_nodes(trace)
    start, end = _window(nodes)
    roots = _costed_roots([n for n in nodes if n.event.get("cat") != "cuda_runtime"])
    launches = {(n.event.get("args") or {}).get("correlation"): n for n in nodes
                if n.event.get("cat") in ("cuda_runtime", "cuda_driver")}
    grouped: dict[int, Work] = {}
    works, intervals = [], []
    for e in trace.get("traceEvents", []):
        if e.get("cat") not in GPU_CATS or e.get("ph") != "X":
            continue
        k_start, k_end = max(float(e["ts"]), start), min(float(e["ts"]) + float(e.get("dur", 0)), end)
        if k_end <= k_start:
            continue
        ms = (k_end - k_start) / 1e3
        intervals.append((k_start, k_end))
        owner = _launching_op(launches.get((e.get("args") or {}).get("correlation")), roots)
        if owner is None:
            works.append(_kernel_work(e, ms))
            continue
        _add_kernel(grouped, owner, e, ms)
    busy = events.union(intervals) / 1e3
    wall = (end - start) / 1e3
    works += list(grouped.values()) + [Work("device idle (host)", HOST, max(wall - busy, 0.0))]
    return works, busy, wall


def _add_kernel(grouped: dict[int, Work], owner: tuple[EventNode, OpCost], event: dict, ms: float) -> None:
    """Fold one kernel into its launching op's Work: times add up; the category is the op's (its FLOPs
    are the op's), its first kernel's name when the op's is 'other'; a lone kernel's grid decides the
    one-wave rule."""
    node, cost = owner
    work = grouped.get(id(node))
    if work is None:
        category = _category(node)
        if category == "other":
            category = classify_kernel(event.get("name", ""))
        grouped[id(node)] = Work(node.name, category, ms, cost.flops, cost.bytes, cost.math, _blocks(event))
        return
    work.source_ms += ms
    work.kernels += 1
    work.blocks = None  # several kernels: the one-wave rule no longer applies to the op
