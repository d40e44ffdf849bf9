"""The GPU side of a trace: which kernels, memcpys and memsets count, their time per category per
step, busy and idle time, HTA's computation / communication / memory split and Tensor Core use;
torch-free.

Why by hand: Holistic Trace Analysis (HTA) gives the computation / communication / memory split but
no categories, no precision and no steps; this module counts the same way HTA does, so the two can be
checked side by side (benchmarks/hta_cross_check.py, docs/explain.md), and adds what HTA lacks.

Selection (HTA's rules): a GPU event counts when the CPU launch that its correlation id names is in
the trace and was made before the last ProfilerStep (which is left out); kernels launched before the
profiler started have no launch and are left out. A trace with fewer than two ProfilerSteps keeps
every GPU event. GPU work that ends after the last CPU op is counted: a step spans its CPU region and
every kernel it launched.
Counting: kernels on concurrent streams overlap. The categories of a step split its busy time (the
union of its kernels): a stretch where k categories run is shared 1/k each, so categories + idle =
the step's wall time exactly. HTA's kinds are merged per kind (the union of that kind's kernels), as
HTA's `get_gpu_kernel_breakdown` does before it reports "X overlapping Y" stretches as rows of their
own: a kind's union is the sum of every row that names it. Idle is the GPU span (first kernel start
to last kernel end) less the union of all kernels, as HTA's temporal breakdown measures it.
Launch context: a computation kernel launched under `Optimizer.step` is the optimizer's, a copy
kernel launched by a dtype-changing `aten::copy_` is a cast; NCCL kernels and memcpys stay
communication and layout wherever they were launched.
"""
from __future__ import annotations

from amp_bench.analysis.explain import categories
from amp_bench.analysis.explain import events as ev
from amp_bench.analysis.explain.kernels import kernel_math, tensor_core_summary, without_dtypes

NO_GPU_EVENTS = ("the CUDA trace holds no kernel, memcpy or memset in its steps: CUPTI recorded nothing (another "
                 "profiler such as Nsight Systems holds it, or a second profiler session in one process lost it: "
                 "pytorch/kineto#1554)")


def _launches(events: list[dict]) -> dict:
    """correlation id -> the CUDA runtime / driver call that launched it, nested under its CPU ops."""
    runtime = [e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")]
    nodes = ev.nest_events([e for e in events if e.get("cat") in ("cpu_op", "user_annotation")] + runtime)
    launches = {(node.event.get("args") or {}).get("correlation"): node for node in nodes
                if node.event.get("cat") in ("cuda_runtime", "cuda_driver")}
    launches.pop(None, None)  # a call without a correlation id names no GPU event
    return launches


def _select(gpu: list[dict], launches: dict, windows: ev.Windows) -> list[tuple[dict, ev.EventNode | None, int | None]]:
    """(event, its launch, its step index or None) for every GPU event that counts."""
    kept = []
    for e in gpu:
        launch = launches.get((e.get("args") or {}).get("correlation"))
        if launch is None:
            if windows.whole_trace or (len(windows.steps) <= 1 and windows.cutoff is None):
                kept.append((e, None, 0 if windows.steps else None))
            continue  # launched before the profiler started: HTA leaves it out too
        if windows.cutoff is not None and launch.start >= windows.cutoff:
            continue  # launched in the last ProfilerStep, which is left out
        step = next((i for i, (s, end) in enumerate(windows.steps) if s - 1e-3 <= launch.start <= end + 1e-3), None)
        if windows.cutoff is None and step is None and not windows.whole_trace and len(windows.steps) > 1:
            continue  # amp_bench's own steps: only what they launched
        kept.append((e, launch, step))
    return kept


def _category(e: dict, launch: ev.EventNode | None) -> str:
    category = categories.classify_kernel(e.get("name", ""))
    if launch is None or categories.kernel_kind(e.get("name", "")) != "computation":
        return category  # NCCL and memcpy/memset stay themselves, wherever they were launched
    if launch.in_optimizer:
        return "optimizer"
    ops = [a for a in launch.ancestors() if a.event.get("cat") == "cpu_op"]
    if category in ("layout", "elementwise") and ops and ops[0].name == "aten::copy_" and \
            categories.copy_is_cast((ops[0].event.get("args") or {}).get("Input type")):
        return "cast"  # the kernel's name hides the dtype change; its launching op shows it
    return category


def _interval(e: dict) -> tuple[float, float]:
    start = float(e["ts"])
    return start, start + float(e.get("dur", 0) or 0)


def split_busy(items: list[tuple[float, float, str]]) -> tuple[dict[str, float], float]:
    """(start, end, category) intervals -> ({category: us}, busy us): each stretch of time is shared
    equally by the categories running in it, so the categories sum to the busy time."""
    bounds = sorted({t for s, e, _ in items for t in (s, e)})
    edges = sorted([(s, 1, c) for s, e, c in items if e > s] + [(e, -1, c) for s, e, c in items if e > s])
    active: dict[str, int] = {}
    out: dict[str, float] = {}
    busy, prev, i = 0.0, None, 0
    for t in bounds:
        running = [c for c, n in active.items() if n > 0]
        if prev is not None and running:
            for c in running:
                out[c] = out.get(c, 0.0) + (t - prev) / len(running)
            busy += t - prev
        while i < len(edges) and edges[i][0] == t:
            active[edges[i][2]] = active.get(edges[i][2], 0) + edges[i][1]
            i += 1
        prev = t
    return out, busy


def _steps(kept, windows: ev.Windows, phases: ev._Phases, phase_ms: dict) -> list[ev.StepTimes]:
    per_step: dict[int, list] = {}
    for e, launch, step in kept:
        if step is None:
            continue
        start, end = _interval(e)
        per_step.setdefault(step, []).append((start, end, _category(e, launch)))
        phase_ms[ev._phase_of(launch, phases) if launch is not None else "other"] += (end - start) / 1e3
    steps = []
    for index, (w_start, w_end) in enumerate(windows.steps):
        items = per_step.get(index, [])
        split, busy = split_busy(items)
        first = min([w_start] + [s for s, _, _ in items])
        last = max([w_end] + [e for _, e, _ in items])  # GPU work after the step's last CPU op counts
        by_category = {c: split.get(c, 0.0) / 1e3 for c in categories.CATEGORIES}
        steps.append(ev.StepTimes((last - first) / 1e3, busy / 1e3, by_category))
    return steps


def _totals(kept) -> dict:
    """HTA's figures over every counted GPU event: busy time per kind (merged), all, and the span."""
    by_kind: dict[str, list] = {k: [] for k in categories.KINDS}
    for e, _, _ in kept:
        by_kind[categories.kernel_kind(e.get("name", ""))].append(_interval(e))
    every = [iv for ivs in by_kind.values() for iv in ivs]
    return {"kinds_ms": {k: ev.union(v) / 1e3 for k, v in by_kind.items()}, "gpu_busy_ms": ev.union(every) / 1e3,
            "gpu_events": len(every), "gpu_span_ms": (max(e for _, e in every) - min(s for s, _ in every)) / 1e3}


def _model_kernels(kept) -> frozenset:
    """The names of the kernels a model runs whatever its precision: not the GEMM/conv/attention ones
    (their library and format change with the GPU and the mode), casts or collectives."""
    skipped = categories.ACCELERATED + ("cast", "communication")
    return frozenset(without_dtypes(e.get("name", "")) for e, _, _ in kept
                     if categories.classify_kernel(e.get("name", "")) not in skipped)


def _math(kept) -> dict[str, float]:
    """GEMM and conv kernel time (ms) by the number format their names give."""
    out: dict[str, float] = {}
    for e, _, _ in kept:
        name = e.get("name", "")
        math = kernel_math(name) if categories.classify_kernel(name) in ("gemm", "conv") else None
        if math:
            start, end = _interval(e)
            out[math] = out.get(math, 0.0) + (end - start) / 1e3
    return out


def _gpu_only_window(events: list[dict]) -> ev.Windows:
    """A trace without CPU ops (kernels and runtime calls only, as older inference traces are): one step
    from the first launch or GPU event to the last one's end."""
    timed = [_interval(e) for e in events if e.get("cat") in ev.GPU_CATS + ("cuda_runtime", "cuda_driver")]
    return ev.Windows([(min(s for s, _ in timed), max(e for _, e in timed))],
                   ["no CPU op in the trace: its GPU work, first launch to last kernel, is one step"], whole_trace=True)


def _tensor_cores(kept) -> dict:
    """Tensor Core use of the GEMM and conv kernels, with the launching op's shapes for those off them."""
    kernel_ms: dict[str, float] = {}
    shapes: dict[str, tuple] = {}
    for e, launch, _ in kept:
        name = e.get("name", "")
        category = categories.classify_kernel(name)
        if category not in categories.ACCELERATED or category == "attention":
            continue
        start, end = _interval(e)
        kernel_ms[name] = kernel_ms.get(name, 0.0) + (end - start) / 1e3
        op = next((a for a in launch.ancestors() if (a.event.get("args") or {}).get("Input Dims")), None) \
            if launch is not None else None
        if op is not None and name not in shapes:
            shapes[name] = (op.name, op.event["args"]["Input Dims"])
    summary = tensor_core_summary(kernel_ms)
    summary["off"] = [(name, ms) + shapes.get(name, ("", None)) for name, ms in summary["off"]]
    summary["kernels"] = kernel_ms  # each GEMM/conv kernel's ms over the trace (advice: its align1 kernels)
    return summary


def cuda_profile(trace: dict, events: list[dict], nodes: list[ev.EventNode], windows: ev.Windows,
                 trace_path) -> ev.Profile:
    """The Profile of a CUDA (or ROCm) trace; NoGpuActivity when its steps hold no GPU event."""
    gpu = [e for e in events if e.get("cat") in ev.GPU_CATS]
    if gpu and windows.whole_trace and not windows.steps:
        windows = _gpu_only_window(events)
    kept = _select(gpu, _launches(events), windows)
    if not kept or not windows.steps:
        raise ev.NoGpuActivity(NO_GPU_EVENTS)
    phases = ev._Phases(nodes)
    phase_ms = {p: 0.0 for p in ev.PHASES}
    steps = _steps(kept, windows, phases, phase_ms)
    notes = list(windows.notes)
    unlinked = sum(1 for _, launch, _ in kept if launch is None)
    if unlinked:
        notes.append(f"{unlinked} GPU events without a launch in the trace: phase 'other', name rules only")
    outside = sum(1 for _, _, step in kept if step is None)
    if outside:
        notes.append(f"{outside} GPU events launched outside the steps: in the totals, not in a step")
    devices = trace.get("deviceProperties") or [{}]
    inside = [n for start, end in windows.steps for n in ev.within(nodes, start, end)]
    return ev.from_steps("cuda", steps, phases_ms=ev.per_step_phases(phase_ms, phases, len(steps)),
                         shapes=ev._shapes(inside), trace_path=trace_path, notes=notes,
                         tensor_cores=_tensor_cores(kept), device_name=str(devices[0].get("name", "")),
                         math_ms=_math(kept), kernel_set=_model_kernels(kept), **_totals(kept))
