"""One extra training step under torch.profiler, after the timed window and outside every timed
figure: this module only captures; analysis/explain/ reads and judges what it saved.

What it saves, for the parent to read: the step's Chrome trace, gzipped (Perfetto opens it), at the
path the launcher gives in AMP_BENCH_EXPLAIN_TRACE (RUN_DIR/traces/STEM.json.gz), and beside it
STEM.layers.json, the shapes of every GEMM (Linear, transformers' Conv1D) and convolution layer as
the step's forward saw them, named by module (what Tensor Core alignment is judged on; the profiler
records shapes per aten op but not which module they belong to). The row gets explain_trace and
explain_status "captured", or "unavailable" and why; a failure here never costs the measurement.

Why the trace and not `prof.key_averages()`: it has no step window, no phases, no idea of the device
being idle and no categories; reading the trace gives one code path for a trace taken now and one
saved earlier. CUDA: the first profiler start in a process initialises CUPTI (a fraction of a second
to seconds); a throwaway CUDA profiler session pays it first, and the profiled step is timed from its
own region in the trace, synchronised inside it, so every kernel it launched ends inside the window.
"""
from __future__ import annotations

import contextlib
import gzip
import inspect
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from amp_bench.stats import layers_path, onednn_path

TRACE_ENV = "AMP_BENCH_EXPLAIN_TRACE"  # where the worker saves the trace (launchers/launch.py sets it)
# the regions analysis/explain/trace.py reads (it holds the same two strings; a test keeps them equal)
STEP_REGION = "amp_bench::step"
PHASE_PREFIX = "amp_bench::"
MARKED_PHASES = ("forward", "backward", "optimizer")


class _PhaseMarks:
    """`marks(phase)` as TrainStep calls it at each phase boundary: closes the open
    `amp_bench::<phase>` region and opens the next ("end" just closes)."""

    def __init__(self, record_function):
        self.record_function = record_function
        self.current = None

    def __call__(self, phase: str) -> None:
        self.close()
        if phase in MARKED_PHASES:
            self.current = self.record_function(PHASE_PREFIX + phase)
            self.current.__enter__()

    def close(self) -> None:
        if self.current is not None:
            self.current.__exit__(None, None, None)
            self.current = None


def _takes_marks(step_fn) -> bool:
    with contextlib.suppress(TypeError, ValueError):
        return "marks" in inspect.signature(step_fn).parameters
    return False


MIN_STEPS, MAX_STEPS = 3, 8  # a spread needs three; past eight the trace's export and parsing dominate
BUDGET_STEPS = 5  # the profiled steps may take as long as this many measured steps (or MIN_BUDGET_S): the
#                  main job's ResNet-50 on a 2-core CPU profiles 3-4 steps of ~1.2 s, not 6-7
MIN_BUDGET_S = 2.0


def steps_to_profile(done: int, elapsed_s: float, median_ms: float | None) -> bool:
    """After `done` profiled steps that took `elapsed_s` with the profiler on: take another? At least
    MIN_STEPS, at most MAX_STEPS, and beyond the minimum only while the next one (at the cost the
    profiler has shown so far) fits the budget: BUDGET_STEPS measured steps, at least MIN_BUDGET_S."""
    if done < MIN_STEPS:
        return True
    if done >= MAX_STEPS:
        return False
    budget = max(MIN_BUDGET_S, BUDGET_STEPS * (median_ms or 0.0) / 1e3)
    return elapsed_s + elapsed_s / done <= budget


def keep_cupti_alive() -> None:
    """Two profiler sessions in one process (the throwaway that pays CUPTI's start-up, then the real
    one) can leave the second without GPU events when CUPTI is torn down in between
    (pytorch/kineto#1554): Kineto reads TEARDOWN_CUPTI=0 and keeps it. Set before the first session;
    a value the user set is kept."""
    os.environ.setdefault("TEARDOWN_CUPTI", "0")


def warm_cuda_profiler() -> None:
    """Start and stop a CUDA profiler session once, so CUPTI's one-off start-up is paid here."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    keep_cupti_alive()
    with profile(activities=[ProfilerActivity.CUDA]):
        torch.cuda.synchronize()


def _run_steps(step_fn, record_function, sync, median_ms, fixed_steps) -> int:
    """Profiled steps, each in its own amp_bench::step region; how many from what they cost."""
    done, started = 0, time.perf_counter()
    while (done < fixed_steps) if fixed_steps else steps_to_profile(done, time.perf_counter() - started, median_ms):
        marks = _PhaseMarks(record_function)
        with record_function(STEP_REGION):
            try:
                if _takes_marks(step_fn):
                    step_fn(marks=marks)
                else:
                    step_fn()
            finally:
                marks.close()
            sync()
        done += 1
    return done


def profile_step(step_fn, device_type: str, trace_path: str | os.PathLike, record_shapes: bool = True,
                 median_ms: float | None = None, fixed_steps: int | None = None) -> str:
    """Run `step_fn` several times under torch.profiler and save the gzip Chrome trace at `trace_path`.

    `step_fn()`, or `step_fn(marks=...)` when it takes `marks` (then the forward, backward and
    optimizer phases are marked as regions, e.g. `lambda marks=None: step(inputs, target, marks=marks)`).
    How many steps: `fixed_steps`, else steps_to_profile's rule (MIN_STEPS to MAX_STEPS, within a
    budget of BUDGET_STEPS x `median_ms`, the measured step). The activities are the device's
    (DeviceOps.profiler_activities: CPU always, CUDA on a GPU). Returns the path as a string.
    """
    from torch.profiler import profile, record_function

    from amp_bench.measure.devices import for_device
    activities, sync = for_device(device_type).profiler_activities()
    with profile(activities=activities, record_shapes=record_shapes) as prof:
        _run_steps(step_fn, record_function, sync, median_ms, fixed_steps)
    saved = str(trace_path)
    os.makedirs(os.path.dirname(os.path.abspath(saved)), exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="amp_bench_trace_", ignore_cleanup_errors=True) as workdir:
        raw = os.path.join(workdir, "trace.json")
        prof.export_chrome_trace(raw)
        with open(raw, "rb") as src, gzip.open(saved, "wb", compresslevel=6) as dst:
            shutil.copyfileobj(src, dst)
    return saved


def onednn_kernels(step_fn, path: str) -> bool:
    """One more step (never a profiled one: oneDNN's verbose mode times and prints every primitive)
    under oneDNN verbose, its exec lines saved at `path` (analysis/explain/onednn.py reads them).
    oneDNN prints from C to file descriptor 1, so that is pointed at a file for the step."""
    import torch
    if not torch.backends.mkldnn.is_available():
        return False
    sys.stdout.flush()
    with tempfile.TemporaryFile(mode="w+b") as sink:
        saved_fd = os.dup(1)
        os.dup2(sink.fileno(), 1)
        try:
            with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
                step_fn()
        finally:
            sys.stdout.flush()
            os.dup2(saved_fd, 1)
            os.close(saved_fd)
        sink.seek(0)
        lines = [line for line in sink.read().decode("utf-8", "replace").splitlines() if ",exec," in line]
    Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return True


def _strip(name: str) -> str:
    """Module names as the user wrote the model: without DDP's `module.` and compile's `_orig_mod.`."""
    for prefix in ("module.", "_orig_mod."):
        while name.startswith(prefix):
            name = name[len(prefix):]
    return name.replace("._orig_mod.", ".")


def _layer_of(name: str, module, inputs, output) -> dict | None:
    """{name, kind, dims, calls} of a GEMM or conv layer's call (alignment.Layer's fields)."""
    import torch
    x = inputs[0] if inputs else None
    if not isinstance(x, torch.Tensor):
        return None
    if isinstance(module, torch.nn.Linear):
        k, n = module.in_features, module.out_features
    elif type(module).__name__ == "Conv1D" and hasattr(module, "nf"):  # transformers GPT-2: weight (in, out)
        k, n = module.weight.shape[0], module.nf
    elif isinstance(module, torch.nn.modules.conv._ConvNd):
        out = output if isinstance(output, torch.Tensor) else None
        positions = out.numel() // out.shape[1] if out is not None else x.shape[0]  # batch x output positions
        return {"name": _strip(name), "kind": type(module).__name__, "calls": 1, "dims": {
            "in": module.in_channels, "out": module.out_channels, "groups": module.groups,
            "kernel": list(module.kernel_size), "positions": int(positions)}}
    else:
        return None
    return {"name": _strip(name), "kind": "Linear", "calls": 1,
            "dims": {"in": int(k), "out": int(n), "rows": int(x.numel() // max(k, 1))}}


@contextlib.contextmanager
def record_layers(model):
    """Forward hooks on every Linear, Conv1D (transformers) and ConvNd of `model` for as long as the
    block runs; yields a list that holds the layer records (one per module, calls counted) once the
    block has exited. Use it around a step of an eager model; a compiled model would recompile for
    the hooks, so give its `_orig_mod` and run an eager forward instead."""
    import torch
    records: dict[str, dict] = {}
    handles = []

    def hook_for(name):
        def hook(module, inputs, output):
            if name in records:
                records[name]["calls"] += 1
                return
            layer = _layer_of(name, module, inputs, output)
            if layer is not None:
                records[name] = layer
        return hook

    for name, module in model.named_modules():
        if isinstance(module, (torch.nn.Linear, torch.nn.modules.conv._ConvNd)) or type(module).__name__ == "Conv1D":
            handles.append(module.register_forward_hook(hook_for(name)))
    layers: list[dict] = []
    try:
        yield layers
    finally:
        for handle in handles:
            handle.remove()
        layers.extend(records.values())


def _eager_module(model):
    """The module the user wrote: DDP's `.module`, compile's `._orig_mod` unwrapped; and whether it
    was compiled (then hooks would make dynamo recompile, so shapes come from a separate forward)."""
    inner = getattr(model, "module", model)
    original = getattr(inner, "_orig_mod", None)
    return (original, True) if original is not None else (inner, False)


def capture(step, inputs, target, device_type: str, trace_path: str | None, median_ms: float | None = None,
            fixed_steps: int | None = None) -> dict:
    """Profile a few more steps of `step` (a TrainStep) and save their trace, the layers (recorded in
    the first of them) and, on a CPU outside DDP, the oneDNN kernels of one step after them; the row's
    explain_trace / explain_status / explain_reason. Never raises. Without `trace_path` (a DDP rank
    other than 0) it runs the same steps unprofiled when `fixed_steps` says how many, so every rank
    takes part in every gradient all-reduce."""
    run = lambda marks=None: step(inputs, target, marks=marks)
    try:
        if not trace_path:
            for _ in range(fixed_steps or 0):
                run()
            return {"explain_status": "unavailable", "explain_trace": "",
                    "explain_reason": f"no trace path ({TRACE_ENV} unset: only a run saves traces)"}
        import torch

        from amp_bench.measure.models import forward
        module, compiled = _eager_module(step.model)
        layers: list[dict] = []
        if compiled:  # hooks would make dynamo recompile: the shapes come from an eager forward
            with record_layers(module) as recorded, torch.no_grad():
                forward(module, inputs)
            layers = recorded

        def profiled(marks=None):
            if layers or compiled:
                return run(marks)
            with record_layers(module) as recorded:  # the first profiled step only: calls per step
                run(marks)
            layers.extend(recorded)

        profile_step(profiled, device_type, trace_path, median_ms=median_ms, fixed_steps=fixed_steps)
        Path(layers_path(trace_path)).write_text(json.dumps(layers), encoding="utf-8")
        from amp_bench.measure.devices import for_device
        if for_device(device_type).onednn_kernels and not fixed_steps:  # under DDP: one more collective step
            onednn_kernels(run, onednn_path(trace_path))
        return {"explain_status": "captured", "explain_trace": str(trace_path), "explain_reason": ""}
    except Exception as exc:  # the profile is an explanation, never a reason to lose the measurement
        return {"explain_status": "unavailable", "explain_trace": "",
                "explain_reason": f"profiling failed: {type(exc).__name__}: {exc}"[:300]}
