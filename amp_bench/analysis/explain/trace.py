"""Reading profiled steps out of a torch.profiler (Kineto) Chrome trace: time per category, per
phase, busy and host time per step, and the recorded GEMM/conv shapes; torch-free.

Why by hand: `prof.key_averages()` sums self times per op name across threads and has no notion of
a step's window, the phases we mark or the device being idle; Holistic Trace Analysis has nothing
on CPU traces and no categories finer than compute/memory/communication. Reading the trace itself
gives one code path for a trace just taken, one saved earlier and one a user captured in their own
job (Perfetto opens the same file).

Steps: amp_bench's own `amp_bench::step` regions (profile.py marks several), else the profiler's
`ProfilerStep#N` regions less the last one (the profiler stops inside it; HTA leaves it out too),
else the whole trace as one step. Every step is read alone, so each category has a median and a
spread (analysis/explain/noise.py), and the Profile's own figures are the medians.

CPU (`device_type='cpu'`): each op's *self* time (its duration less its direct children's, per
thread), so nested ops are never counted twice; an op under the profiler's `Optimizer.step#...` or
`Optimizer.zero_grad#...` region is the optimizer's, and so is that region's own Python time. Busy
time is the union of the top-level intervals (ops and optimizer regions) over all threads; host time
is the step's wall time less busy time (Python and framework time between ops).
CUDA: gpu_trace.py (kernels selected by their launch, overlapping streams split, idle, Tensor Cores).
"""
from __future__ import annotations

from amp_bench.analysis.explain import events as ev
from amp_bench.analysis.explain import gpu_trace
from amp_bench.analysis.explain.categories import ACCELERATED, CATEGORIES


def _cpu_step(nodes: list[ev.EventNode], phases: ev._Phases, phase_ms: dict) -> tuple[dict, float]:
    """One step's CPU categories (self times) and busy time; adds its time per phase to `phase_ms`."""
    categories = {c: 0.0 for c in CATEGORIES}
    intervals = []
    for node in nodes:
        cat = node.event.get("cat")
        in_optimizer = ev._is_optimizer_region(node) or node.in_optimizer
        if cat == "user_annotation" and not in_optimizer and not ev._counted_annotation(node):
            continue  # our marks, the step region, ProfilerStep#: their own time is host time
        if not (node.in_op or node.in_optimizer):
            intervals.append((node.start, node.end))  # a top-level op or optimizer region
        category = "optimizer" if in_optimizer else ev._op_category(node)
        ms = ev._self_time(node) / 1e3
        categories[category] += ms
        phase_ms[ev._phase_of(node, phases)] += ms
    return categories, ev.union(intervals) / 1e3


_TYPE_MATH = {"float": "fp32", "c10::BFloat16": "bf16", "c10::Half": "fp16"}
_CAST_OPS = ("aten::copy_", "aten::to", "aten::_to_copy")


def _cpu_model(nodes: list[ev.EventNode]) -> tuple[dict[str, float], frozenset]:
    """(GEMM/conv time by the number format of their inputs, the names of the other ops: what the
    model runs whatever its precision) of a CPU trace's steps."""
    math: dict[str, float] = {}
    names = set()
    for node in nodes:
        if node.event.get("cat") != "cpu_op":
            continue
        if node.name in ev._GEMM_CONV_OPS:
            types = (node.event.get("args") or {}).get("Input type") or [""]
            kind = _TYPE_MATH.get(types[0] if isinstance(types[0], str) else "")
            if kind:
                math[kind] = math.get(kind, 0.0) + (node.end - node.start) / 1e3
        elif ev._op_category(node) not in ACCELERATED + ("cast",) and node.name not in _CAST_OPS:
            names.add(node.name)
    return math, frozenset(names)


def read_profile(source, device_type: str | None = None, trace_path: str | None = None) -> ev.Profile:
    """The per-category breakdown of the steps in `source` (a trace dict or file). `device_type`
    None: 'cuda' when the trace holds GPU events or names a GPU, else 'cpu'."""
    trace = ev.load_trace(source)
    events = ev.timed_events(trace, trace_path or ("the trace" if isinstance(source, dict) else str(source)))
    if device_type is None:
        device_type = "cuda" if trace.get("deviceProperties") or any(e.get("cat") in ev.GPU_CATS for e in events) \
            else "cpu"
    nodes = ev.nest_events([e for e in events if e.get("cat") in ev.CPU_CATS])
    windows = ev.step_windows(nodes)
    if device_type == "cuda":
        return gpu_trace.cuda_profile(trace, events, nodes, windows, trace_path)
    phases = ev._Phases(nodes)
    phase_ms = {p: 0.0 for p in ev.PHASES}
    steps, shapes, stepped = [], [], []
    for start, end in windows.steps:
        inside = ev.within(nodes, start, end)
        categories, busy = _cpu_step(inside, phases, phase_ms)
        steps.append(ev.StepTimes((end - start) / 1e3, busy, categories))
        shapes = shapes or ev._shapes(inside)
        stepped += inside
    math_ms, kernel_set = _cpu_model(stepped)
    return ev.from_steps("cpu", steps, phases_ms=ev.per_step_phases(phase_ms, phases, len(steps)), shapes=shapes,
                      trace_path=trace_path, notes=windows.notes, math_ms=math_ms, kernel_set=kernel_set)
