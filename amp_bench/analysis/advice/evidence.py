"""What the advice rules read about one profiled step, from wherever it came from: a results row with the
files its worker saved beside its trace (the GEMM/conv layers, oneDNN's verbose step), or a trace alone, or
the kernel table of a GPU check's summary. Every figure is per step; what a source does not give stays
empty, and a rule that needs it stays silent. Torch-free."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from amp_bench.analysis.advice.casts import CastReading, read_casts
from amp_bench.analysis.advice.probe import ProbedChange, ProbeReading, read_probe
from amp_bench.analysis.explain.alignment import Layer, read_layers
from amp_bench.analysis.explain.categories import CATEGORIES
from amp_bench.analysis.explain.judge import layers_path
from amp_bench.analysis.explain.onednn import records_path
from amp_bench.errors import UserError
from amp_bench.stats import probe_path


@dataclass
class Reorder:
    """One oneDNN reorder the verbose step ran: its ms, its layouts and the tensor's shape."""
    ms: float
    formats: str
    shape: tuple[int, ...]


@dataclass
class Evidence:
    device_type: str  # cpu | cuda
    precision: str
    step_ms: float  # the measured median step (or a trace's profiled step)
    profiled_ms: float  # the profiled step the categories below add up to, with host time
    categories_ms: dict[str, float]
    host_ms: float = 0.0  # GPU: idle device; CPU: framework time between ops
    device_name: str = ""
    kernels_ms: dict[str, float] = field(default_factory=dict)  # GEMM/conv kernel name -> ms per step (CUDA)
    layers: list[Layer] = field(default_factory=list)  # GEMM/conv layers with their dims (layers.json)
    misaligned: list[tuple[str, float]] = field(default_factory=list)  # (layer label, share of GEMM FLOPs)
    reorders: list[Reorder] = field(default_factory=list)  # CPU: oneDNN's reorders in its verbose step
    onednn_conv_ms: float = 0.0  # CPU: oneDNN's convolution time in the same verbose step
    case: dict = field(default_factory=dict)  # model, batch, layout, optimizer, compile, fp8: as the row says
    shape_misaligned: dict = field(default_factory=dict)  # multiple -> misaligned GEMM ops from a trace's shapes
    steps_known: bool = True  # False: a trace without step regions (its "step" is the whole trace, idle and all)
    probe: ProbeReading | None = None  # the shape probe's readings saved beside the trace (a run's first repeat)
    probe_error: str = ""  # why a probe file beside the trace could not be read
    casts: CastReading | None = None  # a mixed-precision trace's casts, whose each (casts.py)

    def share(self, ms: float) -> float:
        """`ms` of the profiled step as a share of it."""
        return ms / self.profiled_ms if self.profiled_ms else 0.0

    def measured(self, profiled: float) -> float:
        """Profiled-step ms scaled to the measured step (the profile's step runs a little slower)."""
        return profiled * self.step_ms / self.profiled_ms if self.profiled_ms else profiled

    def probed(self, rule: str) -> ProbedChange | None:
        """The shape probe's timings of `rule`'s change, both sides of at least one shape; None without."""
        change = self.probe.changes.get(rule) if self.probe else None
        return change if change is not None and change.shapes else None

    def unprobed(self, rule: str) -> str:
        """Why there is no probe reading of `rule`'s change here, in a few words."""
        if self.probe_error:
            return self.probe_error
        if self.probe is not None and rule in self.probe.failed:
            return f"the shape probe could not make the change: {self.probe.failed[rule]}"
        if self.probe is not None and rule in self.probe.changes:
            return (f"the shape probe's budget ({self.probe.budget_s:.1f} s) ran out before it timed any of its "
                    f"{len(self.probe.changes[rule].untimed)} shapes")
        return "no shape probe beside this profile (a trace alone, a compiled or DDP case, an older run)"


CASE_COLUMNS = ("model", "model_label", "batch_size", "seq_len", "image_size", "channels_last", "optimizer",
                 "optimizer_impl", "compile_mode", "scaler_host_sync", "fp8_layers_converted", "fp8_layers_skipped",
                 "model_parameters", "case_id", "group_id", "repeat", "emulated")


def _number(value) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return 0.0
    return number if number == number else 0.0


def parse_reorders(lines) -> tuple[list[Reorder], float]:
    """oneDNN verbose exec lines -> (the reorders, with layouts and shapes; the convolutions' total ms)."""
    reorders, conv_ms = [], 0.0
    for line in lines:
        fields = line.strip().split(",")
        if len(fields) < 6 or "exec" not in fields:
            continue
        i = fields.index("exec")
        try:
            kind, ms = fields[i + 2], float(fields[-1])
        except (IndexError, ValueError):
            continue
        if kind == "convolution":
            conv_ms += ms
        elif kind == "reorder":
            dims = tuple(int(d) for d in re.findall(r"\d+", fields[-2]))
            reorders.append(Reorder(ms, fields[i + 5] if len(fields) > i + 5 else "", dims))
    return reorders, conv_ms


def from_row(row: dict, run_dir) -> Evidence | None:
    """A results row with a breakdown (explain_status ok), and the files saved beside its trace."""
    if row.get("explain_status") not in ("ok", "distorted") or not _number(row.get("explain_profiled_ms")):
        return None
    device_type = "cuda" if str(row.get("device", "cpu")).startswith("cuda") else "cpu"
    evidence = Evidence(device_type, str(row.get("precision")), _number(row.get("step_time_ms_median"))
                        or _number(row.get("explain_profiled_ms")), _number(row.get("explain_profiled_ms")),
                        {c: _number(row.get(f"explain_{c}_ms")) for c in CATEGORIES},
                        _number(row.get("explain_host_ms")), str(row.get("device_name") or ""),
                        case={c: row.get(c) for c in CASE_COLUMNS})
    evidence.misaligned = parse_misaligned(row.get("explain_misaligned_layers"))
    trace = row.get("explain_trace")
    if isinstance(trace, str) and trace and run_dir is not None:
        _add_saved_files(evidence, Path(run_dir) / trace)
    return evidence


MIXED = ("amp_", "fp8")  # precisions that run under autocast: their traces hold casts worth reading


def parse_misaligned(text) -> list[tuple[str, float]]:
    """'lm_head Linear(768 -> 50257) 72.5%; ...' (explain_misaligned_layers) -> [(label, 0.725), ...]: where
    the layer records themselves are not at hand (a GPU check's summary, a copied results table)."""
    matches = (re.match(r"\s*(.+?\))\s+([\d.]+)%\s*$", part) for part in str(text or "").split(";"))
    return [(match.group(1), float(match.group(2)) / 100) for match in matches if match]


def _add_saved_files(evidence: Evidence, trace: Path) -> None:
    """The layers and oneDNN's verbose step saved beside a trace, where the worker left them."""
    try:
        evidence.layers = read_layers(layers_path(trace))
    except Exception:  # no layers: the rules that need them stay silent
        evidence.layers = []
    if evidence.precision.startswith(MIXED) and trace.is_file():
        try:
            evidence.casts = read_casts(trace)
        except UserError:  # explain said what is wrong with the trace; the casts rule stays silent
            evidence.casts = None
    probe = probe_path(trace)
    if probe.is_file():
        try:
            evidence.probe = read_probe(probe)
        except UserError as exc:  # said where a rule would have priced from it
            evidence.probe_error = str(exc)
    onednn = records_path(trace)
    if onednn.is_file():
        evidence.reorders, evidence.onednn_conv_ms = parse_reorders(
            onednn.read_text(encoding="utf-8", errors="replace").splitlines())


def optimizer_from_names(names) -> tuple[str, str]:
    """(optimizer, implementation) as a trace's op and kernel names show it: fused Adam/AdamW or SGD by their
    fused ops, foreach by `_foreach_` ops (CPU) or multi-tensor-apply kernels (GPU), Adam's family by its
    square root, addcdiv and lerp passes (a for-loop Adam by those alone); ("", "") where nothing says."""
    joined = " ".join(names).lower()
    if "_fused_adam" in joined or "fusedadam" in joined:
        return "adamw", "fused"
    if "_fused_sgd" in joined or "fusedsgd" in joined:
        return "sgd", "fused"
    adam = any(word in joined for word in ("addcdiv", "sqrt", "lerp"))
    if "_foreach_" in joined or "multi_tensor_apply" in joined:
        return ("adamw" if adam else "sgd"), "foreach"
    return ("adamw", "for-loop") if adam else ("", "")  # Adam's per-parameter ops, one tensor at a time


def misaligned_from_shapes(shapes: list[dict], multiple: int) -> list[tuple[str, float, dict]]:
    """(label, share of the GEMMs' FLOPs, the misaligned dims) of the GEMM ops a trace recorded with shapes
    (mm, addmm, bmm): where no layer records were saved, the ops' own K and N judge alignment."""
    gemms = []
    for record in shapes:
        matrices = [d for d in record.get("dims") or [] if isinstance(d, list) and len(d) >= 2]
        if "conv" in record.get("op", "") or len(matrices) < 2:
            continue
        m, k, n = matrices[0][-2], matrices[0][-1], matrices[1][-1]
        flops = 2 * m * k * n * int(record.get("count", 1))
        gemms.append((f"{record['op']}({m}x{k} @ {k}x{n})", flops, {"K": k, "N": n}))
    total = sum(f for _, f, _ in gemms)
    return [(label, flops / total, bad) for label, flops, dims in gemms
            if total and (bad := {key: v for key, v in dims.items() if v % multiple})]


def from_profile(profile, precision: str = "") -> Evidence:
    """A trace read by `explain --trace` (analysis/explain/trace.py's Profile): its categories, idle time,
    GEMM kernels per step and op shapes, and the optimizer its op names show; no layer records."""
    steps = max(1, len(profile.steps))
    evidence = Evidence(profile.device_type, precision, profile.wall_ms, profile.categories_sum_ms + profile.host_ms,
                        dict(profile.categories_ms), profile.host_ms, profile.device_name)
    evidence.kernels_ms = {name: ms / steps for name, ms in ((profile.tensor_cores or {}).get("kernels") or {}).items()}
    name, impl = optimizer_from_names(profile.kernel_set)
    evidence.case = {"optimizer": name, "optimizer_impl": impl}
    evidence.shape_misaligned = {m: misaligned_from_shapes(profile.shapes, m) for m in (8, 16)}
    evidence.steps_known = not any("is one step" in note for note in profile.notes)
    if profile.trace_path:
        try:
            evidence.casts = read_casts(profile.trace_path)
        except UserError:
            evidence.casts = None
    return evidence
