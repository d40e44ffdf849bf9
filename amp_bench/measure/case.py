"""What is measured: one case's training step, set up, warmed up and timed in this process.

`prepare_case` applies the mode (hardware gate, FP32 math flags, cuDNN autotuning, the autocast
proof) and `build_step` builds the model, optimizer, batch and step: the worker and the
pytest-benchmark fixture both set a case up through these two, so one case measured two ways is
the same measurement. `run_case` adds the timed window and the telemetry around it.
"""
from __future__ import annotations

import contextlib
import math
import os
import random
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from amp_bench import modes
from amp_bench.measure import compiling, trackers
from amp_bench.measure.baton import NO_BATON, WINDOW_OVER, Baton, NoBaton
from amp_bench.measure.channel import EventChannel
from amp_bench.measure.ddp import Rank, synced_steps, threads_per_rank
from amp_bench.measure.devices import for_device
from amp_bench.measure.devices.base import DeviceOps
from amp_bench.measure.phases import PhaseClock
from amp_bench.measure.procfs import read_rss_bytes
from amp_bench.measure.telemetry.contention import WindowWatch
from amp_bench.measure.telemetry.flops import count_step_flops, flops_columns
from amp_bench.measure.telemetry.phase_memory import phase_columns
from amp_bench.measure.telemetry.profile import MIN_STEPS, TRACE_ENV, capture
from amp_bench.measure.window import StopRule, WindowTimes, measure_window, stop_rule
from amp_bench.platform.device import DeviceInfo, may_run, not_run_reason
from amp_bench.platform.nvml import NvmlReader
from amp_bench.stats import MEASURED_PHASE, WORKER_PHASES, Window, median_ci, phase_column
from amp_bench.suite import Case

if TYPE_CHECKING:  # a set-up case's step (the module imports torch)
    from amp_bench.measure.step import TrainStep


def _settle_after_warmup(case, mode, step, inputs, target, ops, reader, record: dict, steps_taken: int) -> None:
    """Between warmup and the window. Every device: the FP32 math checked again as it resolves now
    (building the model, or a library it imported, may have changed the flags). Then the device's
    own settling (DeviceOps.settle; CUDA: cudnn.benchmark's cached workspaces dropped, one untimed
    step, the peaks reset, NVML `used` read as the window opens)."""
    from amp_bench.measure.precision import check_fp32_math, read_fp32_math_flags
    check_fp32_math(mode.name, mode.fp32_math, read_fp32_math_flags(), ops.fp32_math_env())
    record.update(ops.settle(step, inputs, target, reader, steps_taken))


def _after_window(case, device, ops, step, inputs, target, median_ms: float, phases: PhaseClock | None = None) -> dict:
    """Outside the timed window: one step counted for FLOPs, instrumented for per-phase memory too (the
    counter allocates nothing). A compiled case's counted step runs its eager module, so its memory gets
    a step of its own, compiled; so does a case whose FLOPs another worker of the run counts."""
    phases = phases or PhaseClock()
    out: dict = {}
    probe = ops.phase_probe() if case.instrument else None
    apart = probe is not None and (hasattr(step.model, "_orig_mod") or not case.count_flops)
    if apart:
        step(inputs, target, marks=probe.mark)
        ops.synchronize()
        phases.mark("memory_probe")
    flops = None
    if case.count_flops:  # once per model, batch and layout in a run (studies/flop_counts.py)
        flops = count_step_flops(step, inputs, target, marks=probe.mark if probe is not None and not apart else None)
        ops.synchronize()
        phases.mark("flops")
    if probe is not None:
        out.update(phase_columns(probe))
    peak, source, bf16_peak = ops.peak_rates(device.name, case.precision)
    if case.peak_tflops:
        peak, source = case.peak_tflops, "given by the user"
    out.update(flops_columns(flops, median_ms, peak, source, bf16_peak))
    return out


def _explain(case, device, step, inputs, target, median_ms: float, rank=None) -> dict:
    """explain: a few more steps under torch.profiler after the window; rank 0 saves the trace. Under DDP
    every rank runs the same fixed number of steps with gradient sync (so communication is real),
    guarded by a timeout (measure/ddp.py)."""
    trace = os.environ.get(TRACE_ENV) if os.environ.get("RANK", "0") == "0" else None
    if rank is None:
        return capture(step, inputs, target, device.type, trace, median_ms)
    return synced_steps(rank, lambda: capture(step, inputs, target, device.type, trace, median_ms, MIN_STEPS),
                        MIN_STEPS, median_ms)


def prepare_case(case, device, record: dict, support):
    """Apply a case's precision mode in this process and prove it took: the hardware gate's decision
    (`support`, made once by whoever planned the case: platform.device.precision_support), the FP32
    math flags (recorded as they resolved), cuDNN autotuning and the autocast proof, which only this
    process can give. Returns the mode (the
    registry's modes.Mode); raises UnsupportedCase when the mode can't run here."""
    import torch

    from amp_bench.measure.precision import autocast_engages, check_fp32_math, read_fp32_math_flags, set_fp32_math
    from amp_bench.measure.step import UnsupportedCase

    record["emulated"] = support.emulated
    record["emulated_reason"] = support.reason if support.emulated else ""
    if not may_run(support, case.allow_emulated):
        raise UnsupportedCase(not_run_reason(support))
    mode = modes.get(case.precision)
    set_fp32_math(mode.fp32_math)
    record.update(read_fp32_math_flags())
    # checked as resolved (a backend- or generic-level setting, an environment override): an fp32
    # baseline that really ran TF32 would make every speedup measured against it wrong
    check_fp32_math(mode.name, mode.fp32_math, record, for_device(device.torch_device).fp32_math_env())
    # cuDNN autotuning, as NVIDIA's and timm's training scripts use it; the warmup absorbs the search
    torch.backends.cudnn.benchmark = case.cudnn_benchmark
    record["cudnn_benchmark"] = case.cudnn_benchmark
    engaged, why = autocast_engages(mode, device.type)
    if not engaged:
        raise UnsupportedCase(why)
    return mode


def seed_case(case) -> None:
    """Python's, numpy's and torch's generators from the case's seed, before the model is built."""
    import numpy as np
    import torch
    random.seed(case.seed)
    np.random.seed(case.seed % 2**32)
    torch.manual_seed(case.seed)


def build_step(case, device_type: str, torch_device, record: dict, wrap=None, mode=None):
    """Model, optimizer, one synthetic batch on the device and the training step for a case; the
    worker and the pytest-benchmark fixture both measure this. Model details go into `record`.
    `wrap(model)` (DDP) wraps the model the step calls; the optimizer holds the same parameters."""
    from amp_bench.measure.models import build_workload
    from amp_bench.measure.step import TrainStep, UnsupportedCase, build_optimizer

    workload = build_workload(case.model.__dict__, image_size=case.image_size, seq_len=case.seq_len,
                              channels_last=case.channels_last, search_dirs=case.search_dirs)
    record.update({f"model_{k}": v for k, v in workload.details.items()})
    model = workload.model.to(torch_device)
    model.train()
    record["model_parameters"] = sum(p.numel() for p in model.parameters())
    if modes.get(case.precision).float8_linear:  # before the optimizer: it must hold the converted layers' weights
        from amp_bench.measure.fp8 import convert
        record.update(convert(model, case.fp8_recipe, device_type, case.fp8_skip_first_last))
    try:
        optimizer = build_optimizer(model.parameters(), case.optimizer)
    except (RuntimeError, ValueError) as exc:
        raise UnsupportedCase(f"optimizer {case.optimizer.name} ({case.optimizer.impl}): {exc}") from exc
    inputs, target = workload.make_batch(case.batch_size, torch_device)  # once, on the device
    if wrap is not None:
        model = wrap(model)
    model = compiling.compile_model(model, case)  # lazily: it compiles in the first warmup step (compiling.py)
    compiling.compile_optimizer_step(optimizer, case)
    step = TrainStep(model, workload.loss_fn, optimizer, mode or modes.get(case.precision), device_type)
    record["scaler_host_sync"] = step.scaler_host_sync  # a per-step sync fp16 pays with a non-fused optimizer
    return step, inputs, target


@dataclass
class _Setup:
    """A case made ready in this process: its device seam, mode, record so far, step and batch, stop
    rule, the device meter (NVML) where there is one, and its rank under DDP."""
    case: Case
    device: DeviceInfo
    ops: DeviceOps
    mode: modes.Mode
    record: dict
    step: TrainStep
    inputs: Any  # the batch on the device: a tensor, or a model's dict of them
    target: Any
    rule: StopRule
    rank: Rank | None = None
    reader: NvmlReader | None = None
    baseline: int | None = None
    watch: WindowWatch | None = None  # the host at the window's edges, made at warmup
    phases: PhaseClock = field(default_factory=PhaseClock)  # the worker's phase clock (measure/phases.py)
    warmup_taken: int = 0  # the warmup steps run (a compiled case's until compilation settled)


def run_case(case, device, events: EventChannel, rank=None, *, support, baton: Baton | NoBaton = NO_BATON,
             phases=None, windows: int = 1) -> dict:
    """Build, warm up and measure one case. Returns the record (status ok or nonfinite). `support`: the
    hardware gate's decision for it, made by the parent that planned it (platform.device.precision_support).

    Under torchrun `rank` (distributed.Rank) is this process's place in the job: the model is
    wrapped in DDP and every rank runs this same function; the step itself is unchanged.
    `baton` (measure/baton.py): a lockstep member's, on the CPU. It sets up and warms up in its first turn,
    measures its window in turns taken with the other members, and instruments in its last.
    `phases` (measure/phases.py): the worker's clock, marked as each phase of the case ends.
    `windows` > 1: as many windows, one after another, for as many repeats of the case (repeats_per_worker):
    the later ones' records, each whole, are the record's `more_windows`."""
    phases = phases or PhaseClock()
    baton.take()
    setup = _set_up(case, device, rank, support, phases)
    losses: list = []
    warmup_steps = setup.warmup_taken = _warm_up(setup, losses, events, baton)
    baton.pass_turn()  # every member warms up before any window opens
    first = _record_window(setup, _window(setup, losses, events, warmup_steps, baton), losses, warmup_steps)
    phases.mark("window")
    more = _more_windows(setup, events, windows - 1, warmup_steps + first.steps)
    events.emit(event="phase", phase="after")  # the measurement is taken: the parent's contention watch ends
    baton.give(WINDOW_OVER)
    baton.take()  # the instrumented steps after every member's window
    _instrument(setup, first)
    record = {**setup.record, **first.columns()}
    if more:
        record["more_windows"] = more
    return record


def _more_windows(setup: _Setup, events: EventChannel, count: int, steps_before: int) -> list[dict]:
    """`count` more windows right after the first, each a later repeat's whole record: the worker's columns
    as they stood after the first window (its set-up, flags, compile), then the window's own; its phases are
    its window alone (the worker's start, build and warmup are the first repeat's). No probe runs for them."""
    records = []
    for _ in range(count):
        losses: list = []
        window = _record_window(setup, _window(setup, losses, events, 0), losses, 0, steps_before)
        steps_before += window.steps
        records.append({**setup.record, **window.columns(), **{phase_column(name): 0.0 for name in WORKER_PHASES},
                        phase_column("window"): round(setup.phases.hand_off(), 4)})
    return records


def _set_up(case, device, rank, support, phases: PhaseClock) -> _Setup:
    """The case in this process: threads, the device seam (and DDP's rank), the mode, the memory cap,
    seeds, the device meter's idle baseline, then the model, optimizer, batch and step."""
    import torch

    phases.mark("imports")
    if rank is not None:  # set explicitly: torchrun alone would leave one thread per rank
        torch.set_num_threads(int(os.environ.get("AMP_BENCH_THREADS_PER_RANK") or threads_per_rank(case)))
    record: dict = {"num_threads": torch.get_num_threads(),
                    "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY") or "default (spin, then sleep)"}
    ops = for_device(torch.device(device.torch_device))  # every per-device difference goes through ops
    backend = None
    if rank is not None:
        backend = rank.backend(case, device.type)
        rank.check(case, device, backend)
        ops = ops.for_rank(rank, device)
        record["threads_per_rank"] = record["num_threads"]
    ops.make_current()
    record.update(ops.tune_allocator(case))
    mode = prepare_case(case, device, record, support)
    if case.memory_cap_bytes:
        record.update(ops.cap_memory(case))  # running out is an ordinary, catchable OOM
    seed_case(case)
    record["rss_before_model_bytes"] = read_rss_bytes()
    if rank is not None:
        rank.init(backend, ops.torch_device)
    phases.mark("setup")
    reader, baseline, notes = ops.open_telemetry(device, rank)
    record.update(notes)
    phases.mark("idle_baseline")
    step, inputs, target = build_step(case, device.type, ops.torch_device, record, mode=mode,
                                      wrap=None if rank is None else lambda m: rank.wrap(m, ops.torch_device))
    ops.synchronize()
    phases.mark("build")
    return _Setup(case, device, ops, mode, record, step, inputs, target, stop_rule(case, rank), rank, reader,
                  baseline, phases=phases)


def _warm_up(setup: _Setup, losses: list, events: EventChannel, baton: Baton | NoBaton) -> int:
    """Warmup (on until compilation settles for a compiled case), then the settle step; how many ran."""
    case, record = setup.case, setup.record
    total = case.warmup_steps + setup.rule.max_steps  # the most steps this case can take, for progress
    events.emit(event="phase", phase="warmup", total=total)
    setup.watch = WindowWatch(setup.ops.host_threads(record["num_threads"]), partners=baton.partners)
    if not case.compiled:  # inductor's compile workers would count as other processes
        setup.watch.mark_warmup()  # a window too short for /proc/stat is judged with its warmup
    launched = os.environ.get("AMP_BENCH_LAUNCHED_AT")  # the parent's clock when it started this worker
    # launch -> first step, less a lockstep member's wait for its first turn
    record["worker_start_s"] = time.time() - float(launched) - baton.waited_s if launched else None
    compile_columns = compiling.warm_up(case, setup.step, setup.inputs, setup.target, losses,
                                        lambda i: _warmup_step_done(setup, events, i, total))
    compiling.log_summary(compile_columns)
    record.update(compile_columns)
    setup.ops.synchronize()
    setup.phases.mark("warmup")
    _settle_after_warmup(case, setup.mode, setup.step, setup.inputs, setup.target, setup.ops, setup.reader, record,
                         len(losses))
    setup.phases.mark("settle")
    return len(losses)  # a compiled case warms up until compilation settles: maybe more than asked


def _warmup_step_done(setup: _Setup, events: EventChannel, index: int, total: int) -> None:
    """Progress; after the first step (cuDNN's autotuning, a compile) its own phase, its queue drained."""
    if index == 0:
        setup.ops.synchronize()
        setup.phases.mark("first_step")
    events.emit(event="step", phase="warmup", step=index, total=total)


def _window(setup: _Setup, losses: list, events: EventChannel, warmup_steps: int,
            baton: Baton | NoBaton = NO_BATON) -> trackers.WindowReading:
    """The timed window with its trackers: its step times, and the trackers' columns and warnings."""
    case, rule = setup.case, setup.rule
    nvml = trackers.NvmlTracker(setup.reader, setup.baseline, case.nvml_interval_ms, case.batch_size) \
        if setup.reader is not None else None
    window_trackers = [trackers.MemoryTracker(setup.ops), *([nvml] if nvml else []),
                       trackers.ContentionTracker(setup.watch, nvml)]
    if case.compiled:
        window_trackers.append(trackers.CompileTracker(setup.record))
    timer = setup.ops.step_timer(rule.max_steps)
    if setup.rank is not None:  # every rank has warmed up (DDP rebuilt its buckets): start the window together
        setup.rank.barrier()
    total = warmup_steps + rule.max_steps

    def measure(halt):
        events.emit(event="phase", phase=MEASURED_PHASE, total=total)
        return measure_window(lambda: losses.append(setup.step(setup.inputs, setup.target)), timer, rule,
                              lambda i: events.emit(event="step", phase=MEASURED_PHASE, step=warmup_steps + i,
                                                    total=total), before_end=halt, baton=baton)
    return trackers.run_window(window_trackers, measure)


@dataclass
class WindowRecord:
    """A window's part of the worker's row, built once it closes: its step times and stop rule, the statistics
    over them, every step's loss (warmup's first), what its trackers said, the GradScaler's columns and every
    warning. columns() is that part of the row, its status and per-step samples included."""
    times: WindowTimes
    rule: StopRule
    window: Window
    losses: list[float]
    warmup_steps: int  # the steps in `losses` before the window's
    output_dtype: str
    tracker_columns: dict
    scaler_columns: dict
    warnings: list[str]

    @property
    def steps(self) -> int:
        return len(self.times.per_step_ms)

    def status(self) -> tuple[str, str]:
        """ok, or nonfinite at the first NaN/inf loss (the timings are kept either way)."""
        bad = [i for i, v in enumerate(self.losses) if not math.isfinite(v)]
        if not bad:
            return "ok", ""
        return "nonfinite", (f"loss is {self.losses[bad[0]]} at step {bad[0]} ({len(bad)} non-finite of "
                             f"{len(self.losses)})")

    def samples(self) -> list[dict]:
        """Every step's row of samples.csv: warmup's with their loss alone, the window's with their time."""
        ms, first = self.times.per_step_ms, self.warmup_steps
        return [{"phase": "warmup" if i < first else MEASURED_PHASE, "step": i,
                 "step_time_ms": ms[i - first] if i >= first else None, "loss": self.losses[i]}
                for i in range(first + self.steps)]

    def columns(self) -> dict:
        low, high = median_ci(self.times.per_step_ms)
        status, reason = self.status()
        return {**self.tracker_columns, "stop_reason": self.times.stop_reason, "steps": self.steps,
                "min_steps": self.rule.min_steps, "max_steps": self.rule.max_steps, "target_ci": self.rule.target_ci,
                "case_budget_s": self.rule.budget_s, **self.window.to_columns(), "step_time_ms_ci_low": low,
                "step_time_ms_ci_high": high, "loss_first": self.losses[0], "loss_last": self.losses[-1],
                "output_dtype": self.output_dtype, **self.scaler_columns, "warnings": " | ".join(self.warnings),
                "status": status, "reason": reason, "samples": self.samples()}


def _record_window(setup: _Setup, reading: trackers.WindowReading, losses: list, warmup_steps: int,
                   steps_before: int | None = None) -> WindowRecord:
    """The window's record: its times, the trackers' columns and warnings, the losses (`losses`: tensors, warmup's
    first) and the warnings of its steps. `steps_before`: the steps the worker took before this window (its
    warmup, and any earlier window's)."""
    import torch

    step, times = setup.step, reading.times
    window = Window.from_steps(times.per_step_ms, setup.case.batch_size, seconds=times.window_s)
    scaler_columns, step_warnings = _step_warnings(setup, window, warmup_steps if steps_before is None else
                                                   steps_before, len(times.per_step_ms))
    return WindowRecord(times, setup.rule, window, torch.stack(losses).float().cpu().tolist(), warmup_steps,
                        str(step.output_dtype).replace("torch.", "") if step.output_dtype else "",
                        reading.columns, scaler_columns,
                        [*reading.warnings, *filter(None, [window.stats.instability()]), *step_warnings])


def _step_warnings(setup: _Setup, window: Window, steps_before: int, steps: int) -> tuple[dict, list[str]]:
    """The GradScaler's columns (its skips inside the window: the steps after `steps_before`), and the warnings
    of the window's steps: host gaps, skipped optimizer steps, autocast's output dtype."""
    from amp_bench.measure.precision import torch_dtype
    step, mode = setup.step, setup.mode
    columns, warnings = {}, []
    gaps = window.to_columns()["window_gap_fraction"]
    if gaps and gaps > 0.05:
        warnings.append(f"{gaps:.0%} of the measured window fell between steps "
                        "(host-bound?): throughput is below what the per-step times suggest")
    if step.scaler.is_enabled():
        skipped = step.skipped_steps()
        columns = {"scaler_skipped_steps": sum(1 for i in skipped if steps_before <= i < steps_before + steps),
                   "scaler_skipped_warmup_steps": sum(1 for i in skipped if i < setup.warmup_taken),
                   "scaler_final_scale": step.final_scale()}
        if columns["scaler_skipped_steps"]:
            warnings.append(f"GradScaler skipped {columns['scaler_skipped_steps']} of {steps} measured "
                            "optimizer steps: those steps did less work, so throughput is flattered")
    if mode.uses_autocast and step.output_dtype not in (None, torch_dtype(mode)):
        warnings.append(f"model output is {step.output_dtype} under autocast {mode.autocast_dtype}")
    return columns, warnings


def _counted_step(setup: _Setup, median_ms: float) -> dict:
    """FLOPs and per-phase memory (_after_window); under DDP without gradient sync: no collective that a
    rank-local failure here could desync."""
    no_sync = setup.step.model.no_sync() if setup.rank is not None else contextlib.nullcontext()
    with no_sync:
        return _after_window(setup.case, setup.device, setup.ops, setup.step, setup.inputs, setup.target, median_ms,
                             setup.phases)


def _profiled_steps(setup: _Setup, median_ms: float) -> dict:
    """explain's profiled steps (_explain), with the case's explain on."""
    if not getattr(setup.case, "explain", False):
        return {}
    out = _explain(setup.case, setup.device, setup.step, setup.inputs, setup.target, median_ms, setup.rank)
    setup.phases.mark("profile")
    return out


def _shape_probe(setup: _Setup, median_ms: float) -> dict:
    """advice's shape probe (measure/telemetry/shape_probe.py), beside a trace the profile saved: each change
    an advice rule could make, its shapes timed both ways. Not under DDP or compile (its eager layers are not
    the step that ran); no columns: its readings are a file, its seconds a phase."""
    from amp_bench.measure.telemetry.shape_probe import probe_step
    from amp_bench.stats import probe_path
    trace = setup.record.get("explain_trace")
    if setup.record.get("explain_status") != "captured" or not trace or setup.rank is not None or setup.case.compiled:
        return {}
    probe_step(setup.step, setup.inputs, setup.case, setup.ops, probe_path(trace), median_ms)
    setup.phases.mark("shape_probe")
    return {}


# The probes after the window, each (setup, median ms) -> its columns, in this order: the counted and
# instrumented step before the profiled ones, whose profiler would otherwise enter the phases' peaks; the
# shape probe last, beside the trace the profile saved.
AFTER_WINDOW = (_counted_step, _profiled_steps, _shape_probe)


def _instrument(setup: _Setup, window: WindowRecord) -> None:
    """After the window: AFTER_WINDOW's probes, their columns into the set-up's, for a case that instruments or
    counts its FLOPs; never at the cost of the measurement taken (a failure is the window's warning)."""
    if not (setup.case.instrument or setup.case.count_flops):
        return
    try:
        for probe in AFTER_WINDOW:
            setup.record.update(probe(setup, window.window.stats.median))
    except Exception as exc:  # instrumentation must never cost the measurement taken above
        window.warnings.append(f"FLOP/phase instrumentation failed: {type(exc).__name__}: {exc}"[:300])
