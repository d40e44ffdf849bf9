"""Predicted step time, throughput, speedup and peak memory of every case and mode on other GPUs, each
with an interval, or 'unsupported' with the reason; torch-free (pandas).

A GPU source: each piece of the profiled step is scaled (scaling.scale); the device's busy time
moves by the ratio of the scaled pieces' sum to the measured pieces' sum (kernels on concurrent
streams overlap as they did), the idle (host) time stays, and the measured median step moves by the
ratio of the predicted profiled step to the profiled step (so the profiler's own cost cancels).
A recorded source (a suite's GPU case on fake tensors): every op priced by the fitted model (pricing.py,
eager PyTorch), and the step is the larger of that and the host's dispatch time (DISPATCH_MS an op): eager
PyTorch launches asynchronously, so the slower of the two sets the pace. Its peak memory is what the
recorder counted (tensors alive at the CUDA allocator's granularity); AMP's saving is over fp32's peak.
Intervals (INTERVALS, true/predicted): "gpu" is the 10th-90th percentile of measured/predicted end-to-end
time on the development set (NeuSight's inference labels, 134 GPU pairs; never the scored training
labels), where every math unit and the bandwidth have measured achievable fractions on both GPUs;
"gpu-unmeasured" widens it by the spread of the measured fractions around the default one (0.33-0.99 of
the FP32 peak against 0.80 assumed: x0.81 to x2.42), since a GPU whose fraction was not measured may
sit anywhere in it; "recorded" is the 5th-95th percentile of the fitted model's errors on throughput
when a GPU or a model is left out of its fit (fitted.INTERVALS, docs/predict.md), and a recorded case's
speedup takes the same for speedups; a GPU source's speedup takes its modes' wider interval.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import pandas as pd

from amp_bench import modes
from amp_bench.analysis.predict import fitted, pricing
from amp_bench.analysis.predict.scaling import FLOOR_MS, HOST, math_unit, scale
from amp_bench.analysis.predict.settings import fractions
from amp_bench.analysis.predict.source import CaseSource, ModeSource, load_works, read_sources, target_tf32
from amp_bench.errors import UserError
from amp_bench.platform.gpu_specs import GpuSpec, by_key
from amp_bench.store.columns import STUDY_TABLES

# Host time to launch one op in eager PyTorch: ~10 us, rounded up from the 7-9 us (median) cudaLaunchKernel
# alone took in Holistic Trace Analysis's public A100 traces (tests/data/hta).
DISPATCH_MS = FLOOR_MS
# (low, high) factors around a predicted step time and a predicted speedup; the 10th and 90th
# percentiles of measured/predicted on NeuSight's inference labels (the development set, never the
# scored training labels): benchmarks/predict_neusight.py --dev prints them.
THROUGHPUT_LOW, THROUGHPUT_HIGH = fitted.INTERVALS["throughput"]  # measured / predicted samples/s
INTERVALS = {"gpu": (0.88, 1.14), "gpu-unmeasured": (0.71, 2.76), "recorded": (1 / THROUGHPUT_HIGH, 1 / THROUGHPUT_LOW)}
WIDER = ("gpu", "gpu-unmeasured", "recorded")  # from the narrowest
COLUMNS = list(STUDY_TABLES["predicted"])  # a run's predicted.csv holds these (store/columns.py)


@dataclass
class Predicted:
    step_ms: float
    throughput: float | None
    interval: str = "gpu"  # the INTERVALS key
    rules: Counter = field(default_factory=Counter)  # rule -> ms on the target
    categories: dict = field(default_factory=dict)  # category -> (source ms, target ms)
    peak_memory_bytes: float | None = None  # a recorded step's: the tensors alive at its peak


def _unsupported(precision: str, spec: GpuSpec) -> str | None:
    mode = modes.get(precision)
    if spec.capability < mode.cuda_min_capability:
        what = mode.cuda_requirement or f"{precision} needs compute capability {mode.cuda_min_capability}"
        return f"{what}; {spec.label} is {spec.capability[0]}.{spec.capability[1]}" + \
            (" (it would run emulated: no prediction for emulated math)" if mode.cuda_below == "emulated" else "")
    return None


def _no_unit(works, precision: str, spec: GpuSpec, fp32_as) -> str | None:
    for work in works:
        unit = math_unit(work, spec, target_tf32(precision, fp32_as))
        if unit is not None and spec.peak(unit) is None:
            return f"no sourced dense {unit.upper()} rate for {spec.label} in the spec table: no prediction"
    return None


def _tally(pieces: list[tuple], into: Predicted) -> Predicted:
    for work, scaled in pieces:
        into.rules[scaled.rule] += scaled.ms
        src, dst = into.categories.get(work.category, (0.0, 0.0))
        into.categories[work.category] = (src + (work.source_ms or 0.0), dst + scaled.ms)
    return into


def _from_gpu(mode: ModeSource, source: GpuSpec, target: GpuSpec, tf32_dst) -> Predicted:
    pieces = [(w, scale(w, source, target, mode.tf32, tf32_dst)) for w in mode.works]
    # communication kernels stay in the busy time, at their measured time (scaling.UNSCALED)
    device = [(w, s) for w, s in pieces if w.category != HOST]
    host = sum(s.ms for w, s in pieces if w.category == HOST)
    src_sum, dst_sum = sum(w.source_ms or 0.0 for w, _ in device), sum(s.ms for _, s in device)
    busy = mode.busy_ms * (dst_sum / src_sum) if src_sum else 0.0
    ratio = (busy + host) / mode.wall_ms if mode.wall_ms else 1.0
    step = mode.measured_ms * ratio
    throughput = mode.throughput / ratio if mode.throughput else None
    return _tally(pieces, Predicted(step, throughput))


def price_inventory(works, target: GpuSpec, tf32: tuple[bool, bool], batch: int) -> Predicted:
    """A recorded step on `target`: the larger of its ops at the fitted prices (pricing.py, eager PyTorch)
    and the host's dispatch time; `tf32` is what FP32 matmul and convolutions run as there."""
    ops = pricing.Ops.of(works)
    times = pricing.op_ms(ops, target, tf32, fitted.PARAMETERS)
    gpu, host = float(times.sum()), DISPATCH_MS * sum(w.kernels for w in works)
    predicted = Predicted(max(gpu, host), batch * 1e3 / max(gpu, host) if gpu else None)
    for category in dict.fromkeys(ops.category):
        predicted.categories[category] = (0.0, float(times[ops.category == category].sum()))
    predicted.rules["fitted price (recorded step)"] = gpu
    if host > gpu:
        predicted.rules["host dispatch (bounds the step)"] += host - gpu
        predicted.categories[HOST] = (0.0, host - gpu)
    return predicted


def _measured(works, specs: list[GpuSpec], tf32: list) -> bool:
    """Whether every math unit the step's compute runs on, and the bandwidth, has a measured achievable
    fraction on every GPU involved (else the default one stands in, and the interval widens)."""
    return all(({math_unit(w, spec, flags) for w in works} - {None}) | {"bandwidth"} <= set(fractions(spec)[0])
               for spec, flags in zip(specs, tf32, strict=True))


def predict_mode(case: CaseSource, precision: str, target: GpuSpec, fp32_as: str | None = None):
    """(Predicted, "ok", "") or (None, "unsupported" | "no prediction", why) for one mode of one case on
    one target."""
    why = _unsupported(precision, target)
    if why:
        return None, "unsupported", why
    if precision in case.not_recorded:
        return None, "no prediction", case.not_recorded[precision]
    mode = load_works(case, precision)
    if mode is None:
        return None, "no prediction", f"{precision} was not profiled on the source"
    why = _no_unit(mode.works, precision, target, fp32_as)
    if why:
        return None, "no prediction", why
    tf32_dst = target_tf32(precision, fp32_as)
    if not case.is_gpu:
        predicted = price_inventory(mode.works, target, tf32_dst, case.batch)
        predicted.interval, predicted.peak_memory_bytes = "recorded", mode.memory.get("peak")
        return predicted, "ok", ""
    predicted = _from_gpu(mode, case.spec, target, tf32_dst)
    measured = _measured(mode.works, [case.spec, target], [mode.tf32, tf32_dst])
    predicted.interval = "gpu" if measured else "gpu-unmeasured"
    return predicted, "ok", ""


def _source_text(case: CaseSource) -> str:
    if case.is_gpu:
        return f"{case.spec.label} profile (kernel times kept, rescaled)"
    return "the suite's GPU case recorded on fake tensors (no GPU), every op at fitted prices"


def _row(case, precision, target, predicted: Predicted | None, status: str, why: str) -> dict:
    row = {"case": case.label, "precision": precision, "target": target.key, "target_label": target.label,
           "status": status, "reason": why, "source": _source_text(case)}
    if predicted:
        lo, hi = INTERVALS[predicted.interval]
        row.update(step_ms=predicted.step_ms, step_ms_low=predicted.step_ms * lo, step_ms_high=predicted.step_ms * hi,
                   interval_from=predicted.interval, peak_memory_bytes=predicted.peak_memory_bytes)
        if predicted.throughput:
            row.update(throughput=predicted.throughput, throughput_low=predicted.throughput / hi,
                       throughput_high=predicted.throughput / lo)
    return row


def _speedups(rows: list[dict]) -> list[dict]:
    """speedup = the target's predicted baseline step / the mode's, per case and target, with the wider
    of the two modes' intervals."""
    baseline = modes.reference()
    base = {(r["case"], r["target"]): r for r in rows if r["precision"] == baseline and r["status"] == "ok"}
    for row in rows:
        ref = base.get((row["case"], row["target"]))
        if row["status"] != "ok" or ref is None or row["precision"] == baseline:
            continue
        wider = max(row["interval_from"], ref["interval_from"], key=WIDER.index)
        lo, hi = fitted.INTERVALS["speedup"] if wider == "recorded" else INTERVALS[wider]
        speedup = ref["step_ms"] / row["step_ms"]
        row.update(speedup=speedup, speedup_low=speedup * lo, speedup_high=speedup * hi, baseline=baseline)
        if row.get("peak_memory_bytes") and ref.get("peak_memory_bytes"):
            row["memory_saving"] = 1 - row["peak_memory_bytes"] / ref["peak_memory_bytes"]
    return rows


def resolve_targets(names: list[str]) -> list[GpuSpec]:
    specs = by_key()
    unknown = [n for n in names if n not in specs]
    if unknown:
        raise UserError(f"--target: unknown GPU {unknown[0]!r} (known: {', '.join(specs)})")
    return [specs[n] for n in names]


@dataclass
class RunPrediction:
    table: pd.DataFrame  # COLUMNS
    breakdown: pd.DataFrame  # case, precision, target, category, source_ms, target_ms
    cases: list[CaseSource]


def _wanted(case: CaseSource) -> list[str]:
    """The modes to predict: those the source ran or recorded, or could not record (said why)."""
    order = list(modes.names())
    return sorted(set(case.modes) | set(case.not_recorded), key=order.index)


def predict_cases(cases: list[CaseSource], targets: list[str], fp32_as: str | None = None) -> RunPrediction:
    """Every case and mode on every target."""
    specs = resolve_targets(targets)
    rows, parts = [], []
    for case in cases:
        for target in specs:
            for precision in _wanted(case):
                predicted, status, why = predict_mode(case, precision, target, fp32_as)
                rows.append(_row(case, precision, target, predicted, status, why))
                if predicted:
                    parts += [{"case": case.label, "precision": precision, "target": target.key, "category": c,
                               "source_ms": s, "target_ms": t} for c, (s, t) in predicted.categories.items()]
    return RunPrediction(pd.DataFrame(_speedups(rows)).reindex(columns=COLUMNS), pd.DataFrame(parts), cases)


def predict_run(run_dir, targets: list[str], fp32_as: str | None = None,
                source_gpu: str | None = None) -> RunPrediction:
    """Every profiled case and mode of a GPU run on every target (a CPU run is predicted from its suite's GPU
    cases: studies/gpu_predictions.py)."""
    cases = read_sources(run_dir, source_gpu)
    if not cases:
        raise UserError(f"{run_dir}: no GPU case with a profiled step (run on a GPU with explain on; a CPU run "
                        f"is predicted from its suite's GPU cases: `amp_bench predict {run_dir}`)")
    return predict_cases(cases, targets, fp32_as)
