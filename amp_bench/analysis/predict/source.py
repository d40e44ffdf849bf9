"""What a prediction starts from, per case and mode; torch-free.

A GPU run: the measured step time and the profiled step's pieces (scaling.Work), from results.csv and the
traces `explain` kept; each kernel's measured time is kept and only rescaled. Anything else (a suite, or a
run on a CPU, whose time says nothing of a GPU's): the suite's GPU cases, each mode's step recorded on fake
tensors under CUDA's autocast policy (measure/fake_step.py, cached by store/inventories.py), priced op by
op (pricing.py); its memory record beside it.
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
    unpriced: Counter = field(default_factory=Counter)  # an inventory's ops with no cost: name -> calls
    memory: dict = field(default_factory=dict)  # an inventory's memory record (measure/fake_step.py), bytes


@dataclass
class CaseSource:
    label: str
    keys: dict
    device_name: str
    spec: GpuSpec | None  # None: recorded on fake tensors (an op inventory of the suite's GPU case)
    modes: dict[str, ModeSource]
    batch: int = 1
    not_recorded: dict[str, str] = field(default_factory=dict)  # mode -> why its step could not be recorded

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
    """Every case of a GPU run that has a profiled step, with its modes (a CPU run's cases: none; its
    predictions come from its suite's GPU cases instead)."""
    run_dir = Path(run_dir)
    if not (run_dir / "results.csv").is_file():
        raise UserError(f"{run_dir}: no results.csv (expected a run directory written by `amp_bench run`)")
    results = read_table([run_dir], "results")
    for column in ("status", "precision", "batch_size", "device", "step_time_ms_median"):
        if column not in results:
            raise UserError(f"{run_dir / 'results.csv'}: no {column!r} column")
    usable = _usable(results)
    usable = usable[usable["device"].astype(str).str.startswith("cuda")]
    keys = [k for k in identity.case_axes() if k in usable]  # what makes one case (amp_bench/identity.py)
    cases = []
    for _, rows in usable.groupby(keys, dropna=False, sort=False) if keys else []:
        first = rows.iloc[0]
        device_name = str(first.get("device_name", ""))
        by_mode = {str(p): _mode_source(r, run_dir) for p, r in rows.groupby("precision", sort=False)}
        cases.append(CaseSource(identity.case_label(first), {k: first[k] for k in keys}, device_name,
                                _spec_for(device_name, source_gpu, run_dir), by_mode))
    return cases


def is_gpu_run(run_dir) -> bool:
    """Whether the run measured on a GPU (its rows' device), read from results.csv."""
    results = read_table([Path(run_dir)], "results")
    return "device" in results and results["device"].astype(str).str.startswith("cuda").any()


def recorded_source(label: str, keys: dict, batch: int, recorded: dict, not_recorded: dict) -> CaseSource:
    """A GPU case of a suite from its recorded steps: {mode: (trace path, memory record)}, and {mode: why
    not} for the modes whose step could not be recorded on fake tensors."""
    modes_ = {precision: ModeSource(precision, 0.0, None, Path(trace), target_tf32(precision, None),
                                    memory=dict(memory)) for precision, (trace, memory) in recorded.items()}
    return CaseSource(label, keys, "", None, modes_, batch, dict(not_recorded))


def load_works(case: CaseSource, precision: str) -> ModeSource | None:
    """The mode's pieces, read from its trace once (None when the source has no such mode)."""
    mode = case.modes.get(precision)
    if mode is None or mode.works:
        return mode
    if case.is_gpu:
        mode.works, mode.busy_ms, mode.wall_ms = inventory.gpu_works(mode.trace)
    else:
        mode.works, mode.unpriced = inventory.priced_inventory(mode.trace)
    return mode


def target_tf32(precision: str, fp32_as: str | None) -> tuple[bool, bool]:
    """(matmul, conv) TF32 for the FP32 math of `precision` on a target: the mode's own definition
    (amp_bench's fp32 and AMP modes: strict IEEE; tf32: TF32), or `fp32_as` for the modes whose FP32
    math is IEEE ('pytorch-default': what a plain PyTorch script runs, cuDNN TF32 on, matmul off)."""
    own = modes.get(precision).fp32_math
    return FP32_MEANINGS[fp32_as if fp32_as and own == "ieee" else own]
