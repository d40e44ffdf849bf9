"""What the advice rules read about one profiled step, from wherever it came from: a results row with the
files its worker saved beside its trace (the GEMM/conv layers, oneDNN's verbose step), or a trace alone, or
the kernel table of a GPU check's summary. Every figure is per step; what a source does not give stays
empty, and a rule that needs it stays silent. Torch-free."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from amp_bench.analysis.explain.alignment import Layer, read_layers
from amp_bench.analysis.explain.categories import CATEGORIES
from amp_bench.analysis.explain.judge import layers_path
from amp_bench.analysis.explain.onednn import records_path


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

    def share(self, ms: float) -> float:
        """`ms` of the profiled step as a share of it."""
        return ms / self.profiled_ms if self.profiled_ms else 0.0

    def measured(self, profiled: float) -> float:
        """Profiled-step ms scaled to the measured step (the profile's step runs a little slower)."""
        return profiled * self.step_ms / self.profiled_ms if self.profiled_ms else profiled


_CASE_COLUMNS = ("model", "model_label", "batch_size", "seq_len", "image_size", "channels_last", "optimizer",
                 "optimizer_impl", "compile_mode", "scaler_host_sync", "fp8_layers_converted", "fp8_layers_skipped",
                 "model_parameters", "case_id", "group_id", "repeat")


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
                        case={c: row.get(c) for c in _CASE_COLUMNS})
    evidence.misaligned = parse_misaligned(row.get("explain_misaligned_layers"))
    trace = row.get("explain_trace")
    if isinstance(trace, str) and trace and run_dir is not None:
        _add_saved_files(evidence, Path(run_dir) / trace)
    return evidence


def parse_misaligned(text) -> list[tuple[str, float]]:
    """'lm_head Linear(768 -> 50257) 72.5%; ...' (explain_misaligned_layers) -> [(label, 0.725), ...]: where
    the layer records themselves are not at hand (a GPU check's summary, a copied results table)."""
    found = []
    for part in str(text or "").split(";"):
        match = re.match(r"\s*(.+?\))\s+([\d.]+)%\s*$", part)
        if match:
            found.append((match.group(1), float(match.group(2)) / 100))
    return found


def _add_saved_files(evidence: Evidence, trace: Path) -> None:
    """The layers and oneDNN's verbose step saved beside a trace, where the worker left them."""
    try:
        evidence.layers = read_layers(layers_path(trace))
    except Exception:  # noqa: BLE001 - no layers: the rules that need them stay silent
        evidence.layers = []
    onednn = records_path(trace)
    if onednn.is_file():
        evidence.reorders, evidence.onednn_conv_ms = parse_reorders(
            onednn.read_text(encoding="utf-8", errors="replace").splitlines())
