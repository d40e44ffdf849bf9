"""`explain --trace A [--trace B]`: any torch.profiler / Kineto trace a user captured in their own
job, read as amp_bench reads its own: categories per step, idle, HTA's computation / communication /
memory split, Tensor Core use, and with two traces the decomposition of B against A; torch-free.

Written here, not in trace.py, because it is the user-facing summary (tables and sentences) over
what trace.py, gpu_trace.py, kernels.py and decompose.py compute. Which precision each trace ran
is not in a trace: `modes` names them (e.g. fp32 and amp_bf16) when a ceiling is wanted; what else
differs between the two traces, and the ceiling priced on each one's own GPU, are trace_pair.py's.

Idle has one definition in this output: the time in a step when nothing runs on the device (no
kernel, memcpy or memset; on a CPU, no op), the 'host' row; the summary's idle share and the
sentence's are both of that step.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from amp_bench.analysis.explain.categories import CATEGORIES, HOST, KINDS, LABELS
from amp_bench.analysis.explain.decompose import Decomposition, Noise, decompose
from amp_bench.analysis.explain.events import NoGpuActivity, Profile
from amp_bench.analysis.explain.kernels import describe
from amp_bench.analysis.explain.sentence import sentence
from amp_bench.analysis.explain.trace import read_profile
from amp_bench.analysis.explain.trace_pair import differences, pair_ideal
from amp_bench.errors import UserError

WARNED = ("device", "model", "modes")  # differences that make the decomposition more than the precision's


@dataclass
class TraceExplanation:
    names: list[str]
    profiles: list[Profile]
    decomposition: Decomposition | None = None
    notes: list[str] = field(default_factory=list)
    differences: list[tuple[str, str]] = field(default_factory=list)  # trace_pair.differences
    paths: list[Path] = field(default_factory=list)

    def category_rows(self) -> list[dict]:
        """ms per step (median over steps) per category and trace, with the host / idle time."""
        rows = []
        for key in list(CATEGORIES) + [HOST]:
            values = [p.host_ms if key == HOST else p.categories_ms.get(key, 0.0) for p in self.profiles]
            if any(v > 0 for v in values):
                rows.append({"category": LABELS.get(key, key), **dict(zip(self.names, values, strict=True))})
        return rows

    def summary_rows(self) -> list[dict]:
        """Per trace: device, steps, step and idle time, HTA's kinds over the whole trace, Tensor Cores."""
        rows = []
        for name, p in zip(self.names, self.profiles, strict=True):
            row = {"trace": name, "device": p.device_name or p.device_type, "steps": len(p.steps),
                   "step ms (median)": p.wall_ms, "idle ms per step": p.host_ms, "idle share of the step": p.idle_share}
            if p.device_type == "cuda":
                row.update({f"{k} ms (whole trace)": p.kinds_ms.get(k, 0.0) for k in KINDS})
                row["Tensor Core share of GEMM+conv"] = (p.tensor_cores or {}).get("share")
            rows.append(row)
        return rows

    def units(self) -> list[str]:
        return [f"{name}: {describe(p.tensor_cores, False)['summary']}"
                for name, p in zip(self.names, self.profiles, strict=True) if p.device_type == "cuda"]

    def sentences(self) -> list[str]:
        if self.decomposition is None:
            return []
        warned = [kind for kind in WARNED if any(k == kind for k, _ in self.differences)]
        caveat = f" (they differ in more than the precision: {', '.join(warned)}; see above)" if warned else ""
        return [f"{self.names[1]} against {self.names[0]}{caveat}: {sentence(self.decomposition)}"]

    def report_stem(self) -> str:
        """explain-A[-vs-B]-HASH: the hash of the traces' full paths keeps two traces of one file name apart."""
        digest = hashlib.sha1("\n".join(str(p) for p in self.paths).encode()).hexdigest()[:10]
        return "explain-" + "-vs-".join(Path(n).name for n in self.names) + f"-{digest}"


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


def trace_names(paths) -> list[str]:
    """Each trace's file name without .json[.gz]; the full paths when two traces share a file name."""
    paths = [Path(p) for p in paths]
    names = [p.name.split(".json")[0] for p in paths]
    return [str(p) for p in paths] if len(names) == 2 and names[0] == names[1] else names


def explain_traces(paths, modes: tuple[str, str] | None = None, cpu_isa: str | None = None,
                   profiles: list[Profile] | None = None) -> TraceExplanation:
    """One or two traces (`profiles`: already read). With two, what differs between them is said and the
    second is decomposed against the first; with `modes` (and on a CPU `cpu_isa`) it has a ceiling."""
    profiles = profiles or read_traces(paths)
    names = trace_names(paths)
    out = TraceExplanation(names, profiles, paths=[Path(p).resolve() for p in paths])
    for name, p in zip(names, profiles, strict=True):
        out.notes += [f"{name}: {n}" for n in p.notes]
    if len(profiles) == 2:
        base, mode = profiles
        if base.device_type != mode.device_type:
            raise UserError(f"{paths[0]} is a {base.device_type} trace and {paths[1]} a {mode.device_type} one: "
                            "compare traces of one kind of device")
        out.differences = differences(names, profiles, modes)
        ideal, why = pair_ideal(names, profiles, modes, cpu_isa)
        times = [{**p.categories_ms, HOST: p.host_ms} for p in profiles]
        out.decomposition = decompose(times[0], times[1], modes[1] if modes else names[1],
                                      modes[0] if modes else names[0], device_type=base.device_type, ideal=ideal,
                                      base_noise=Noise(base.samples()), mode_noise=Noise(mode.samples()))
        if why:
            out.notes.append(why)
    return out
