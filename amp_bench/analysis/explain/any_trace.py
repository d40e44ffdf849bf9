"""`explain --trace A [--trace B]`: any torch.profiler / Kineto trace a user captured in their own
job, read as amp_bench reads its own: categories per step, idle, HTA's computation / communication /
memory split, Tensor Core use, and with two traces the decomposition of B against A; torch-free.

Written here, not in trace.py, because it is the user-facing summary (tables and sentences) over
what trace.py, gpu_trace.py, kernels.py and decompose.py compute. Which precision each trace ran
is not in a trace: `modes` names them (e.g. fp32 and amp_bf16) when a ceiling is wanted, and the
caller passes the GEMM/conv peak ratio it found for the trace's GPU (platform/peaks.py) or CPU ISA.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from amp_bench.analysis.explain import ceiling as ceilings
from amp_bench.analysis.explain.categories import ACCELERATED, CATEGORIES, HOST, KINDS, LABELS
from amp_bench.analysis.explain.decompose import Decomposition, Noise, decompose
from amp_bench.analysis.explain.kernels import describe
from amp_bench.analysis.explain.sentence import sentence
from amp_bench.analysis.explain.trace import NoGpuActivity, Profile, read_profile
from amp_bench.errors import UserError


@dataclass
class TraceExplanation:
    names: list[str]
    profiles: list[Profile]
    decomposition: Decomposition | None = None
    notes: list[str] = field(default_factory=list)

    def category_rows(self) -> list[dict]:
        """ms per step (median over steps) per category and trace, with the host / idle time."""
        rows = []
        for key in list(CATEGORIES) + [HOST]:
            values = [p.host_ms if key == HOST else p.categories_ms.get(key, 0.0) for p in self.profiles]
            if any(v > 0 for v in values):
                rows.append({"category": LABELS.get(key, key), **dict(zip(self.names, values))})
        return rows

    def summary_rows(self) -> list[dict]:
        """Per trace: device, steps, GPU totals by HTA's kinds, idle over the GPU span, Tensor Cores."""
        rows = []
        for name, p in zip(self.names, self.profiles):
            row = {"trace": name, "device": p.device_name or p.device_type, "steps": len(p.steps),
                   "step ms (median)": p.wall_ms}
            if p.device_type == "cuda":
                row.update({f"{k} ms": p.kinds_ms.get(k, 0.0) for k in KINDS})
                row.update({"GPU idle ms": p.gpu_idle_ms, "idle share of GPU span":
                            (p.gpu_idle_ms / p.gpu_span_ms) if p.gpu_span_ms else None,
                            "Tensor Core share of GEMM+conv": (p.tensor_cores or {}).get("share")})
            rows.append(row)
        return rows

    def units(self) -> list[str]:
        return [f"{name}: {describe(p.tensor_cores, False)['summary']}" for name, p in zip(self.names, self.profiles)
                if p.device_type == "cuda"]

    def sentences(self) -> list[str]:
        if self.decomposition is None:
            return []
        return [f"{self.names[1]} against {self.names[0]}: {sentence(self.decomposition)}"]


def _read(path: Path) -> Profile:
    try:
        return read_profile(path, None, trace_path=str(path))
    except NoGpuActivity as exc:
        raise UserError(f"{path}: {exc}") from None


def read_traces(paths) -> list[Profile]:
    paths = [Path(p) for p in paths]
    if not 1 <= len(paths) <= 2:
        raise UserError("explain --trace takes one trace, or two to compare (the second against the first)")
    return [_read(p) for p in paths]


def explain_traces(paths, modes: tuple[str, str] | None = None, accelerated: float | None = None,
                   accelerated_source: str = "", profiles: list[Profile] | None = None) -> TraceExplanation:
    """One or two traces (`profiles`: already read). With two, the second is decomposed against the
    first; with `modes` and `accelerated` (the GEMM/conv peak ratio of the second's mode to the
    first's) it has a ceiling."""
    profiles = profiles or read_traces(paths)
    paths = [Path(p) for p in paths]
    names = [p.name.split(".json")[0] for p in paths]
    if len(names) == 2 and names[0] == names[1]:
        names = [str(p) for p in paths]
    out = TraceExplanation(names, profiles)
    for name, p in zip(names, profiles):
        out.notes += [f"{name}: {n}" for n in p.notes]
    if len(profiles) == 2:
        base, mode = profiles
        if base.device_type != mode.device_type:
            raise UserError(f"{paths[0]} is a {base.device_type} trace and {paths[1]} a {mode.device_type} one: "
                            "compare traces of one kind of device")
        ideal = None
        if modes:
            ideal = ceilings.ideal_factors(modes[1], {k: accelerated for k in ACCELERATED} if accelerated else None,
                                           accelerated_source)
        times = [{**p.categories_ms, HOST: p.host_ms} for p in profiles]
        out.decomposition = decompose(times[0], times[1], modes[1] if modes else names[1],
                                      modes[0] if modes else names[0], device_type=base.device_type, ideal=ideal,
                                      base_noise=Noise(base.samples()), mode_noise=Noise(mode.samples()))
        if ideal is None:
            out.notes.append("no ceiling: give --modes BASE,MODE (e.g. fp32,amp_bf16) for a GPU in the peak table "
                             "or a CPU ISA (--cpu-isa)")
    return out
