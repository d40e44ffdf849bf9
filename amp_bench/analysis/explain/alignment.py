"""Tensor Core alignment: every GEMM (linear) and convolution layer, named by module, with whether
its dimensions are multiples of 8 (what fp16/bf16 Tensor Core kernels want) and of 16 (fp8), and its
share of the step's FLOPs.

Why by hand: torch.profiler records shapes per aten op but not which module they belong to, and
FlopCounterMode counts FLOPs per module but says nothing of alignment. A misaligned layer falls back
to slower kernels (or padded ones) on a GPU, so a large misaligned FLOP share is one reason AMP
bought less than the GEMM share promised. On a CPU the list is still given: AMX/AVX512-BF16 kernels
care less, and the report says alignment matters on Tensor Core GPUs.

Two halves: measure/telemetry/profile.py's `record_layers(model)` (torch, forward hooks) collects the
shapes in the profiled step and saves them beside its trace (TRACE.layers.json); this module judges
them, plain Python on those records (`read_layers`, `alignment_table`), tested on given shapes.
Checked dimensions: a linear layer's in and out features (K, N), and its rows (M = batch x tokens)
reported beside them (set by the batch, not the model); a convolution's input channels per group
and output channels (cuDNN's Tensor Core kernels want both multiples of 8, NHWC).
FLOPs per layer: 3 x the forward's multiply-adds x 2 (forward, gradient of the input, gradient of the
weight), the convention FlopCounterMode's training counts follow.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from amp_bench.errors import UserError, read_json

CPU_NOTE = ("measured on a CPU: alignment matters on Tensor Core GPUs (multiples of 8 for fp16/bf16, 16 "
            "for fp8); it is listed so the same model can be judged before it runs on one")


@dataclass
class Layer:
    """One GEMM or convolution layer as seen in the forward pass."""
    name: str
    kind: str  # "Linear" or "Conv2d" (any ConvNd), transformers' Conv1D is a Linear
    dims: dict  # Linear: in, out, rows; Conv: in, out, groups, kernel (tuple), positions (N x spatial out)
    calls: int = 1

    def forward_macs(self) -> int:
        d = self.dims
        if self.kind == "Linear":
            return d["rows"] * d["in"] * d["out"]
        return d["positions"] * d["out"] * (d["in"] // d["groups"]) * math.prod(d["kernel"])

    def flops(self) -> int:
        return 3 * 2 * self.forward_macs() * self.calls

    def label(self) -> str:
        d = self.dims
        if self.kind == "Linear":
            return f"{self.name} Linear({d['in']} -> {d['out']})"
        kernel = "x".join(str(k) for k in d["kernel"])
        groups = f", groups={d['groups']}" if d["groups"] != 1 else ""
        return f"{self.name} {self.kind}({d['in']} -> {d['out']}, {kernel}{groups})"

    def checked(self) -> dict:
        """The dimensions alignment is judged on: {dimension name: size}."""
        d = self.dims
        if self.kind == "Linear":
            return {"in_features": d["in"], "out_features": d["out"]}
        return {"in_channels/group": d["in"] // d["groups"], "out_channels": d["out"]}


def alignment_table(layers: list[Layer], step_flops: int | None = None, device_type: str = "cpu") -> list[dict]:
    """One row per layer, largest FLOP share first: label, FLOPs, share, aligned at 8 and at 16,
    the dimensions that are not, and the rows (M) for linear layers. `step_flops` (FlopCounterMode's
    count of the whole step) is the denominator when given, else the layers' own sum."""
    total = step_flops or sum(layer.flops() for layer in layers) or None
    rows = []
    for layer in layers:
        checked = layer.checked()
        rows.append({
            "module": layer.name, "layer": layer.label(), "kind": layer.kind, "flops": layer.flops(),
            "flop_share": layer.flops() / total if total else None,
            "aligned_8": all(v % 8 == 0 for v in checked.values()),
            "aligned_16": all(v % 16 == 0 for v in checked.values()),
            "misaligned_8": ", ".join(f"{k}={v}" for k, v in checked.items() if v % 8),
            "misaligned_16": ", ".join(f"{k}={v}" for k, v in checked.items() if v % 16),
            "rows": layer.dims.get("rows"), "note": CPU_NOTE if device_type != "cuda" else "",
        })
    return sorted(rows, key=lambda r: -(r["flop_share"] or 0))


def misaligned_flop_share(table: list[dict], multiple: int = 8) -> float | None:
    """FLOP share of the layers not aligned at `multiple` (8: fp16/bf16, 16: fp8)."""
    if not table or table[0]["flop_share"] is None:
        return None
    return sum(r["flop_share"] for r in table if not r[f"aligned_{multiple}"])


def misaligned_summary(table: list[dict], multiple: int = 8, limit: int = 5) -> str:
    """'classifier.3 Linear(1000 -> 10) 0.1%; ...': the misaligned layers, largest first."""
    bad = [r for r in table if not r[f"aligned_{multiple}"]]
    text = "; ".join(f"{r['layer']} {r['flop_share']:.1%}" if r["flop_share"] is not None else r["layer"]
                     for r in bad[:limit])
    return text + (f"; +{len(bad) - limit} more" if len(bad) > limit else "")


def read_layers(path) -> list[Layer]:
    """The layer records the worker saved beside a trace (a JSON list of {name, kind, dims, calls});
    a malformed file is one line naming it and the field."""
    path = Path(path)
    records = read_json(path, "layer records", list)
    layers = []
    for i, r in enumerate(records):
        for key in ("name", "kind", "dims"):
            if not isinstance(r, dict) or key not in r:
                raise UserError(f"{path}: record {i} has no field {key!r}")
        dims = dict(r["dims"])
        if "kernel" in dims:
            dims["kernel"] = tuple(dims["kernel"])
        needed = ("in", "out", "rows") if r["kind"] == "Linear" else ("in", "out", "groups", "kernel", "positions")
        missing = [k for k in needed if k not in dims]
        if missing:
            raise UserError(f"{path}: record {i} ({r['name']}): dims has no field {missing[0]!r}")
        layers.append(Layer(str(r["name"]), str(r["kind"]), dims, int(r.get("calls", 1))))
    return layers
