"""Statistics of a window of step times, torch-free: the median's interval, the step-time summary,
which samples are measured, and the one throughput formula (`Window`). The worker, DDP aggregation,
ingest, compare, history and the report all read these; nothing here imports torch."""
from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

UNSTABLE_CV = 0.10  # pyperf warns when stdev >= 10% of the mean


MIN_CI_SAMPLES = 6  # below this no pair of order statistics covers the median with 95% confidence


def median_ci(samples_ms, confidence: float = 0.95) -> tuple[float, float]:
    """Distribution-free confidence interval of the median: the pair of order statistics that covers
    the population median with at least `confidence` (binomial(n, 1/2) ranks). Makes no normality
    assumption, so a skewed step-time distribution (the usual shape) is fine. Fewer than
    MIN_CI_SAMPLES samples: (min, max), which is then no 95% interval, and stop rules don't trust it.
    The adaptive stop rule calls this between measured steps, so it must cost microseconds: the
    rank comes from `_median_rank` (pure Python, cached), not scipy, whose first import alone took
    0.5 s inside a window and showed up as host gap (about 40% of a 1 s CPU window)."""
    a = np.sort(np.asarray(samples_ms, dtype=float))
    n = a.size
    if n == 0:
        raise ValueError("no step times for an interval")
    if n < MIN_CI_SAMPLES:
        return float(a[0]), float(a[-1])
    j = _median_rank(n, confidence)
    return float(a[j]), float(a[n - 1 - j])


@functools.lru_cache(maxsize=4096)
def _median_rank(n: int, confidence: float) -> int:
    """The largest m with P(Bin(n, 1/2) <= m) <= alpha/2 (at least 0): then [x_(m), x_(n-1-m)]
    (0-based) covers the median with probability 1 - 2 P(Bin <= m) >= confidence. The binomial CDF
    is summed in log space (lgamma), exact to float precision for any n a window takes."""
    alpha = 1 - confidence
    log_half_n = n * math.log(0.5)
    lg_n1 = math.lgamma(n + 1)
    cdf, m = 0.0, -1
    for i in range(n // 2 + 1):
        cdf += math.exp(lg_n1 - math.lgamma(i + 1) - math.lgamma(n - i + 1) + log_half_n)
        if cdf > alpha / 2 * (1 + 1e-12):
            break
        m = i
    return max(m, 0)


def relative_half_width(samples_ms) -> float:
    """Half the width of the median's 95% interval, relative to the median."""
    low, high = median_ci(samples_ms)
    a = np.sort(np.asarray(samples_ms, dtype=float))  # np.median's first call imports numpy.ma
    median = float(a[(a.size - 1) // 2] + a[a.size // 2]) / 2
    return (high - low) / 2 / median if median > 0 else math.inf


@dataclass(frozen=True)
class StepStats:
    """Summary of per-step times in milliseconds (a value object, like optimum-benchmark's Latency)."""
    n: int
    median: float
    mean: float
    p10: float
    p90: float
    iqr: float
    cv: float
    min: float
    max: float

    @classmethod
    def from_samples(cls, samples_ms: list[float]) -> StepStats:
        if not samples_ms:
            raise ValueError("no step times to summarise")
        a = np.asarray(samples_ms, dtype=float)
        mean = float(a.mean())
        std = float(a.std(ddof=1)) if a.size > 1 else 0.0
        q10, q25, q50, q75, q90 = np.percentile(a, [10, 25, 50, 75, 90])
        return cls(n=int(a.size), median=float(q50), mean=mean, p10=float(q10), p90=float(q90), iqr=float(q75 - q25),
                   cv=std / mean if mean > 0 else math.nan, min=float(a.min()), max=float(a.max()))

    def instability(self) -> str | None:
        """A pyperf-style warning, or None when the window looks stable."""
        if self.cv >= UNSTABLE_CV:
            return (f"unstable: step-time CV is {self.cv:.0%} (>= {UNSTABLE_CV:.0%}); "
                    "results may not be reproducible — more steps, warmup or a quieter machine help")
        if self.n >= 5 and (self.min < 0.5 * self.mean or self.max > 1.5 * self.mean):
            return (f"unstable: step times range {self.min:.3g}-{self.max:.3g} ms around a mean of "
                    f"{self.mean:.3g} ms (more than 50% off)")
        return None

    def to_columns(self, prefix: str = "step_time_ms") -> dict[str, float]:
        return {f"{prefix}_{k}": v for k, v in asdict(self).items() if k not in ("n", "cv")} | {"step_time_cv": self.cv}


MEASURED_PHASE = "measure"  # a timed step; warmup steps never enter a figure


def measured(samples):
    """The timed steps among per-step samples: a DataFrame (rows of the samples table) or a list
    of sample dicts (a worker record's). The one definition of "the measured samples"."""
    if hasattr(samples, "loc"):
        return samples[(samples["phase"] == MEASURED_PHASE) & samples["step_time_ms"].notna()]
    return [s for s in samples if s.get("phase") == MEASURED_PHASE and s.get("step_time_ms") is not None]


def samples_per_second(samples: float, seconds: float) -> float | None:
    """Throughput: training samples processed (batch x steps x processes) over the seconds it took.
    The one throughput formula: the worker's window, DDP aggregation, ingest and compare use it."""
    if not seconds or seconds <= 0 or not math.isfinite(seconds):
        return None
    return samples / seconds


@dataclass(frozen=True)
class Window:
    """A measured window: per-step times, the wall-clock seconds around them (host gaps included),
    and how many samples each step processed across every process."""
    step_times_ms: tuple[float, ...]
    seconds: float
    batch_size: int
    world_size: int = 1

    @classmethod
    def from_steps(cls, step_times_ms, batch_size: int, seconds: float | None = None, world_size: int = 1) -> Window:
        """`seconds` defaults to the sum of the steps (no gap measured, e.g. pytest-benchmark rounds)."""
        times = tuple(float(t) for t in step_times_ms)
        return cls(times, sum(times) / 1e3 if seconds is None else float(seconds), int(batch_size), int(world_size))

    @property
    def stats(self) -> StepStats:
        return StepStats.from_samples(list(self.step_times_ms))

    @property
    def throughput(self) -> float | None:
        return samples_per_second(self.world_size * self.batch_size * len(self.step_times_ms), self.seconds)

    @property
    def gap_fraction(self) -> float | None:
        """Share of the window outside every step: host work between steps (or, on CUDA, the GPU
        idling while the host catches up)."""
        if not self.seconds or self.seconds <= 0:
            return None
        return max(0.0, 1 - sum(self.step_times_ms) / 1e3 / self.seconds)

    def to_columns(self) -> dict:
        return {**self.stats.to_columns(), "window_s": self.seconds, "throughput": self.throughput,
                "window_gap_fraction": self.gap_fraction}


def energy_rates(energy_j: float | None, samples: float | None) -> dict:
    """Energy per sample and samples per joule: the one formula for the worker's NVML window and for
    DDP aggregation (every GPU's energy over the job's global samples). Unknown stays None, never 0."""
    per_sample = energy_j / samples if energy_j and samples else None
    return {"energy_j_per_sample": per_sample, "samples_per_joule": 1 / per_sample if per_sample else None}


def achieved_rate(flops_per_step: float | None, step_time_ms: float | None, peak_tflops: float | None) -> dict:
    """Achieved TFLOP/s at the median step time and MFU against a dense peak: the one formula for a
    plain worker and for a DDP job (per-rank FLOPs at the job's step time: per-GPU MFU)."""
    achieved = flops_per_step / (step_time_ms / 1e3) / 1e12 if flops_per_step and step_time_ms else None
    return {"achieved_tflops": achieved,
            "mfu": achieved / peak_tflops if achieved is not None and peak_tflops else None}


# Where a case's worker spends its wall time, from its launch to the parent's reap, in the order the phases
# run (name -> what it holds). Each row has a `phase_<name>_s` column per phase (measure/phases.py times them
# in the worker; the parent adds `exit`); together they are the worker's wall time, `worker_wall_s`.
WORKER_PHASES = {
    "start": "launch to the worker's entry: a fork, or a fresh interpreter starting",
    "imports": "the worker's imports of torch and the measurement (near 0 when forked from a server that has them)",
    "setup": "threads, the device, the mode's FP32 flags and autocast proof (a GPU's CUDA context), memory cap, seeds, "
             "DDP's process group",
    "idle_baseline": "the device meter opened and its idle reading taken (CUDA: NVML, cuBLAS and cuDNN warmed)",
    "build": "model, optimizer and batch built on the device (fp8 conversion, compile wrapping)",
    "first_step": "the first warmup step: cuDNN autotuning, lazy initialisation, a compiled case's compile",
    "warmup": "the other warmup steps (a compiled case's until compilation settles)",
    "settle": "the FP32 math re-check and the untimed settle step(s) before the window",
    "window": "the timed window, its trackers and its statistics",
    "memory_probe": "the step for per-phase memory when it is not the FLOPs step (a compiled case, or one whose FLOPs "
                    "another worker counts)",
    "flops": "the step counted for FLOPs (with per-phase memory on an eager case)",
    "profile": "explain's profiled steps and the trace they save",
    "shape_probe": "advice's probe after the profile: the step's distinct layer shapes timed as they run and as an "
                   "advised change would run them (a few seconds at most; measure/telemetry/shape_probe.py)",
    "result": "the result assembled (DDP: every rank's gathered)",
    "exit": "the result written, the process's exit and the parent's reap",
    "wait": "a lockstep member's wait for its partners' turns",
}
# the probes after the window, none of which a repeat can change: per-phase memory and the profile run in a
# case's first repeat only, and a run counts FLOPs once per model, batch and layout (studies/flop_counts.py)
PROBE_PHASES = ("memory_probe", "flops", "profile", "shape_probe")


def phase_column(name: str) -> str:
    return f"phase_{name}_s"


# The files a profiled step leaves beside its trace (traces/STEM.json.gz): named once, for the worker that
# writes them (measure/telemetry/profile.py) and explain and advice that read them.
def _beside_trace(trace_path, suffix: str) -> Path:
    name = Path(trace_path).name
    stem = name.removesuffix(".json.gz") if name.endswith(".json.gz") else name.removesuffix(".json")
    return Path(trace_path).with_name(stem + suffix)


def layers_path(trace_path) -> Path:
    """traces/STEM.json.gz -> traces/STEM.layers.json: the GEMM/conv layer shapes of the profiled steps."""
    return _beside_trace(trace_path, ".layers.json")


def onednn_path(trace_path) -> Path:
    """traces/STEM.json.gz -> traces/STEM.onednn.txt: a CPU step's oneDNN verbose lines."""
    return _beside_trace(trace_path, ".onednn.txt")


def probe_path(trace_path) -> Path:
    """traces/STEM.json.gz -> traces/STEM.probe.json: advice's shape probe, each change's two sides timed."""
    return _beside_trace(trace_path, ".probe.json")
