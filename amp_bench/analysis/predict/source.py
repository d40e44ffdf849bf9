"""What a run offers as the source of a prediction: per case and mode, the measured step time and the
profiled step's pieces (scaling.Work), from results.csv and the traces `explain` kept; torch-free.

A GPU run is the good source: each kernel's measured time is kept and only rescaled. A CPU run gives
an op inventory (shapes, FLOPs, bytes, types, no GPU time), priced at the target's roofline: a wider
interval, and the output says so. On a CPU, fp16 autocast is usually not run (no AMX-FP16), so an AMP
mode is priced from whichever 16-bit inventory the run has (the same ops with 16-bit inputs); and
CPU autocast keeps layer_norm and softmax in the input's 16-bit type where CUDA's runs them in FP32,
so a transformer's memory-bound share comes out smaller than a GPU's.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from amp_bench import identity, modes
from amp_bench.analysis.predict import inventory
from amp_bench.analysis.predict.scaling import FP32_MEANINGS, Work
from amp_bench.errors import UserError
from amp_bench.platform.gpu_specs import GpuSpec, find
from amp_bench.store.flags import is_true
from amp_bench.store.results import read_table

SIXTEEN_BIT = ("fp16", "bf16")


@dataclass
class ModeSource:
    """One mode of one case on the source: its measured median step and the profiled step to scale."""
    precision: str
    measured_ms: float
    throughput: float | None
    trace: Path
    tf32: tuple[bool, bool]  # what FP32 matmul and convolution ran as on the source
    works: list[Work] = field(default_factory=list)
    busy_ms: float = 0.0
    wall_ms: float = 0.0
    borrowed_from: str = ""  # a CPU AMP mode priced from another 16-bit mode's inventory
    unpriced: Counter = field(default_factory=Counter)  # a CPU inventory's ops with no cost: name -> calls


@dataclass
class CaseSource:
    label: str
    keys: dict
    device_name: str
    spec: GpuSpec | None  # None: a CPU source (op inventory)
    modes: dict[str, ModeSource]
    borrowed: dict[str, ModeSource] = field(default_factory=dict)  # CPU: modes priced from another's inventory

    @property
    def is_gpu(self) -> bool:
        return self.spec is not None


def _usable(results: pd.DataFrame) -> pd.DataFrame:
    if "explain_trace" not in results:
        return results.iloc[0:0]
    ok = results["status"].eq("ok") & results["explain_status"].isin(["ok", "distorted"])
    return results[ok & results["explain_trace"].notna()]  # typed on read: an empty cell is NA


def _mode_source(rows: pd.DataFrame, run_dir: Path) -> ModeSource:
    """The mode's median measured step over its repeats, and the trace of a clean repeat."""
    clean = rows[rows["explain_status"] == "ok"]
    row = (clean if not clean.empty else rows).iloc[0]
    trace = run_dir / str(row["explain_trace"])
    if not trace.is_file():
        raise UserError(f"{run_dir / 'results.csv'}: explain_trace {row['explain_trace']!r} of "
                        f"{row.get('case_id', '?')} is not there")
    throughput = rows["throughput"].median() if "throughput" in rows else None
    tf32 = (is_true(row.get("tf32_matmul")), is_true(row.get("tf32_cudnn")))
    return ModeSource(str(row["precision"]), float(rows["step_time_ms_median"].median()),
                      float(throughput) if throughput == throughput else None, trace, tf32)


def _spec_for(device_name: str, source_gpu: str | None, run_dir: Path) -> GpuSpec:
    spec = find(source_gpu or device_name)
    if spec is None:
        named = f"--source-gpu {source_gpu!r}" if source_gpu else f"device_name {device_name!r}"
        raise UserError(f"{run_dir / 'results.csv'}: {named} is not in the spec table (amp_bench/platform/"
                        "gpu_specs.py); name the GPU it is with --source-gpu KEY")
    return spec


def read_sources(run_dir, source_gpu: str | None = None) -> list[CaseSource]:
    """Every case of the run that has a profiled step, with its modes."""
    run_dir = Path(run_dir)
    if not (run_dir / "results.csv").is_file():
        raise UserError(f"{run_dir}: no results.csv (expected a run directory written by `amp_bench run`)")
    results = read_table([run_dir], "results")
    for column in ("status", "precision", "batch_size", "device", "step_time_ms_median"):
        if column not in results:
            raise UserError(f"{run_dir / 'results.csv'}: no {column!r} column")
    usable = _usable(results)
    keys = [k for k in identity.case_axes() if k in usable]  # what makes one case (amp_bench/identity.py)
    cases = []
    for _, rows in usable.groupby(keys, dropna=False, sort=False) if keys else []:
        first = rows.iloc[0]
        device_name = str(first.get("device_name", ""))
        spec = _spec_for(device_name, source_gpu, run_dir) if str(first["device"]).startswith("cuda") else None
        by_mode = {str(p): _mode_source(r, run_dir) for p, r in rows.groupby("precision", sort=False)}
        cases.append(CaseSource(identity.case_label(first), {k: first[k] for k in keys}, device_name, spec, by_mode))
    return cases


def load_works(case: CaseSource, precision: str) -> ModeSource | None:
    """The mode's pieces, read from its trace once. A CPU source prices an AMP mode it did not run from
    another 16-bit mode's inventory (None when it has none)."""
    mode = case.modes.get(precision) or case.borrowed.get(precision)
    if mode is None and not case.is_gpu:
        mode = _borrowed(case, precision)
        if mode is not None:
            case.borrowed[precision] = mode
    if mode is None or mode.works:
        return mode
    if case.is_gpu:
        mode.works, mode.busy_ms, mode.wall_ms = inventory.gpu_works(mode.trace)
    else:
        mode.works, mode.unpriced = inventory.priced_inventory(mode.trace)
        dtype = modes.get(precision).autocast_dtype
        wanted = {"float16": "fp16", "bfloat16": "bf16"}.get(dtype or "")
        if mode.borrowed_from and wanted:
            for work in mode.works:
                work.math = wanted if work.math in SIXTEEN_BIT else work.math
    return mode


def _borrowed(case: CaseSource, precision: str) -> ModeSource | None:
    spec = modes.get(precision)
    if spec.autocast_dtype not in ("float16", "bfloat16") or spec.float8_linear:
        donors = [m for m in case.modes if modes.get(m).family == spec.family and not modes.get(m).is_amp]
    else:
        donors = [m for m in case.modes if modes.get(m).autocast_dtype in ("float16", "bfloat16")
                  and not modes.get(m).float8_linear]
    if not donors:
        return None
    donor = case.modes[donors[0]]
    return ModeSource(precision, donor.measured_ms, donor.throughput, donor.trace, donor.tf32,
                      borrowed_from=donor.precision)


def target_tf32(precision: str, fp32_as: str | None) -> tuple[bool, bool]:
    """(matmul, conv) TF32 for the FP32 math of `precision` on a target: the mode's own definition
    (amp_bench's fp32 and AMP modes: strict IEEE; tf32: TF32), or `fp32_as` for the modes whose FP32
    math is IEEE ('pytorch-default': what a plain PyTorch script runs, cuDNN TF32 on, matmul off)."""
    own = modes.get(precision).fp32_math
    return FP32_MEANINGS[fp32_as if fp32_as and own == "ieee" else own]
