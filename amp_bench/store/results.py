"""Results store: results/<run-id>/ with a tidy table, per-step samples and a manifest.

Every write goes to a temporary file that is then renamed over the old one, after each case, so a
killed run keeps every finished case and no file is ever half-written.
"""
from __future__ import annotations

import datetime as dt
import glob
import json
import os
import re
import socket
from pathlib import Path

import pandas as pd

from amp_bench.errors import UserError
from amp_bench.store.flags import text_column, true_rows
from amp_bench.platform.nvml import NVML_COLUMNS

RESULTS_FILE = "results.csv"
SAMPLES_FILE = "samples.csv"
MANIFEST_FILE = "manifest.json"
# The run directory's layout (asv's idea: a version in every file set, so a later layout can still be
# read, and an older reader says plainly that it cannot). 1: results/samples CSV + manifest.json.
FORMAT_VERSION = 1

# Issue 23's breakdown of one profiled step (analysis/explain/): ms per category (its CATEGORIES, in
# order), host and busy time, the profiled step against the measured median, shares, Tensor Core
# alignment, ms per phase, the saved trace, and whether the breakdown is there. Empty in runs without
# `explain: true`; written out here, as every documented column is (a test holds it to CATEGORIES).
EXPLAIN_COLUMNS = [
    "explain_gemm_ms", "explain_conv_ms", "explain_attention_ms", "explain_elementwise_ms", "explain_norm_ms",
    "explain_reduction_ms", "explain_cast_ms", "explain_layout_ms", "explain_optimizer_ms",
    "explain_communication_ms", "explain_other_ms", "explain_host_ms", "explain_busy_ms", "explain_profiled_ms",
    "explain_profiled_vs_measured", "explain_cast_share", "explain_other_share", "explain_misaligned_flop_share",
    "explain_misaligned_layers", "explain_phase_forward_ms", "explain_phase_backward_ms",
    "explain_phase_optimizer_ms", "explain_phase_scaler_ms", "explain_trace", "explain_status", "explain_reason",
]
# The documented columns, in order; records may carry more (appended after these). Adding columns
# keeps FORMAT_VERSION: an older reader keeps unknown columns after its own, a newer one reads older
# files with the new columns empty.
RESULT_COLUMNS = [
    "run_id", "suite", "case_id", "group_id", "model", "model_label", "batch_size", "precision",
    "channels_last", "image_size", "seq_len", "device", "device_name", "architecture",
    "world_size", "nnodes", "nproc_per_node", "dist_backend", "scaling", "global_batch_size", "repeat", "status",
    "reason", "warmup_steps", "steps", "stop_reason", "min_steps", "max_steps", "target_ci", "case_budget_s",
    "step_time_ms_median", "step_time_ms_ci_low", "step_time_ms_ci_high", "step_time_ms_mean", "step_time_ms_p10",
    "step_time_ms_p90", "step_time_ms_iqr", "step_time_cv", "step_time_ms_min", "step_time_ms_max",
    "throughput", "rank_step_time_ms_medians", "window_s", "window_gap_fraction",
    "contended", "contention", "cpu_share_available", "host_other_cpu_cores", "steal_fraction", "loadavg_1m",
    "gpu_other_processes", "peak_mem_allocated_bytes", "peak_mem_reserved_bytes", "peak_rss_bytes",
    "peak_rss_lifetime_bytes", "rss_before_model_bytes", "rss_hwm_bytes", "cuda_num_alloc_retries", "peak_mem_forward_bytes",
    "peak_mem_backward_bytes", "peak_mem_optimizer_bytes", "phase_memory_source", "flops_per_step",
    "achieved_tflops", "peak_tflops", "mfu", "peak_tflops_source", "peak_tflops_bf16", "mfu_bf16_basis", *NVML_COLUMNS, "loss_first", "loss_last", "scaler_skipped_steps",
    "scaler_skipped_warmup_steps", "scaler_final_scale", "output_dtype", "emulated", "emulated_reason", "tf32_matmul",
    "tf32_cudnn", "cudnn_benchmark", "float32_matmul_precision", "fp32_precision_matmul", "fp32_precision_cudnn_conv", "fp32_precision_cudnn_rnn",
    "compile_mode", "compile_note", "compile_backend", "compile_fullgraph", "compile_optimizer", "compile_cache", "compile_cache_dir",
    "compile_first_step_ms", "compile_time_s", "compile_settled", "warmup_steps_run", "graph_breaks",
    "graph_break_reasons", "recompiles", "recompile_reasons", "recompiles_in_window", "unique_graphs",
    "fp8_recipe", "fp8_layers_converted", "fp8_layers_skipped", "fp8_skip_reasons", "fp8_conv1d_as_linear", "fp8_matmul",
    "fp8_torchao_version",
    "optimizer", "optimizer_impl", "seed", "num_threads", "threads_per_rank", "model_parameters", "model_attn_implementation",
    "model_task", "warnings", "torch_version", "cuda_version", "cudnn_version", "hostname", "fingerprint",
    "gpu_uuid", "driver_version", "compute_capability", "gpu_memory_bytes", "cpu_model", "cpu_count", "cpu_bf16_isa",
    "timestamp",
    "worker_seconds", "log_file", *EXPLAIN_COLUMNS,
]
SAMPLE_COLUMNS = ["run_id", "case_id", "precision", "repeat", "phase", "step", "step_time_ms", "loss"]


def order_columns(table: pd.DataFrame) -> pd.DataFrame:
    """The documented columns first (present even when empty), then any others a record carried."""
    return table.reindex(columns=RESULT_COLUMNS + [c for c in table.columns if c not in RESULT_COLUMNS])


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower() or "x"


def make_run_id(device_label: str, when: dt.datetime | None = None, host: str | None = None) -> str:
    when = when or utc_now()
    return f"{when:%Y%m%dT%H%M%SZ}-{_slug(host or socket.gethostname())}-{_slug(device_label)}"


def write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def write_reports(stem: Path, texts: dict[str, tuple[str, str]]) -> dict[str, Path]:
    """A verdict's files beside each other: {key: (suffix, text)} -> STEM.suffix; their paths by key.
    compare and nightly write their md/JSON/JUnit through this."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = {}
    for key, (suffix, text) in texts.items():
        paths[key] = stem.with_name(stem.name + suffix)
        paths[key].write_text(text, encoding="utf-8")
    return paths


class RunStore:
    """One run directory. Append rows with add(); each call rewrites the tables atomically."""

    def __init__(self, root: Path, run_id: str):
        root = Path(root)
        directory = root / run_id
        n = 1
        while directory.exists():  # two runs in the same second on the same host
            n += 1
            directory = root / f"{run_id}-{n}"
        self.run_id = directory.name
        self.dir = directory
        try:
            (self.dir / "logs").mkdir(parents=True)
            (self.dir / "work").mkdir()
        except OSError as exc:
            raise UserError(f"{root}: cannot create the results directory ({exc.strerror or exc})") from None
        self.rows: list[dict] = []
        self.samples: list[dict] = []
        self.saved = 0  # rows on disk
        self.manifest: dict = {}

    def write_manifest(self, **fields) -> None:
        self.manifest.update(fields)
        self.manifest.setdefault("format_version", FORMAT_VERSION)
        write_text_atomic(self.dir / MANIFEST_FILE, json.dumps(self.manifest, indent=2, default=str) + "\n")

    def add(self, row: dict, samples: list[dict]) -> None:
        self.rows.append(row)
        self.samples.extend(samples)
        self.flush()

    def write_table(self, name: str, rows: list[dict], columns: list[str] | None = None) -> None:
        """Another tidy table of this run (fidelity.csv, headroom.csv, ...), rewritten atomically."""
        frame = pd.DataFrame(rows, columns=columns) if columns else pd.DataFrame(rows)
        write_text_atomic(self.dir / f"{name}.csv", frame.to_csv(index=False))

    def flush(self) -> None:
        table = order_columns(pd.DataFrame(self.rows))
        samples = pd.DataFrame(self.samples, columns=SAMPLE_COLUMNS)
        # samples first: a kill between the two renames leaves samples without a row, never a row
        # without its samples
        write_text_atomic(self.dir / SAMPLES_FILE, samples.to_csv(index=False))
        write_text_atomic(self.dir / RESULTS_FILE, table.to_csv(index=False))
        self.saved = len(self.rows)


# ----------------------------------------------------------------------------- reading
# The one reader of run directories: report, compare, history, the studies' tables and the API all
# find and load runs through these functions.

def find_run_dirs(inputs) -> list[Path]:
    """Run directories from paths to run dirs, trees of them, or glob patterns (a str or a list)."""
    inputs = [inputs] if isinstance(inputs, (str, os.PathLike)) else list(inputs)
    found: list[Path] = []
    for item in inputs:
        text = str(item)
        matches = [Path(p) for p in sorted(glob.glob(text, recursive=True))] if glob.has_magic(text) else [Path(text)]
        if not matches:
            raise UserError(f"{text}: no path matches this pattern")
        for path in matches:
            if not path.exists():
                raise UserError(f"{path}: no such results directory")
            if (path / RESULTS_FILE).is_file():
                found.append(path)
            else:
                found.extend(sorted(p.parent for p in path.rglob(RESULTS_FILE)))
    unique = list(dict.fromkeys(p.resolve() for p in found))
    if not unique:
        raise UserError(f"{', '.join(map(str, inputs))}: no {RESULTS_FILE} found (expected run directories "
                        "written by `amp_bench run`, a tree of them, or a glob)")
    return unique


def dirs_with_table(folder: str | os.PathLike, name: str) -> list[Path]:
    """The run directories under `folder` that hold NAME.csv (a study's table: fidelity, headroom),
    none when the folder is absent: for callers that read what a stage may not have written."""
    folder = Path(folder)
    return sorted(p.parent for p in folder.rglob(f"{name}.csv")) if folder.is_dir() else []


def read_table(run_dirs: list[Path], name: str, columns: list[str] | None = None,
               with_run_dir: bool = False) -> pd.DataFrame:
    """One table (NAME.csv) of every run directory that has it, concatenated; header-only files are
    left out (concatenating them would turn every column to object). Empty: a frame with `columns`.
    with_run_dir adds a `run_dir` column (where each row came from). An unreadable file is a
    UserError naming it, never skipped."""
    frames = []
    for run_dir in run_dirs:
        file = Path(run_dir) / f"{name}.csv"
        if file.is_file() and file.stat().st_size:
            try:
                frame = pd.read_csv(file)
            except (ValueError, pd.errors.ParserError) as exc:
                raise UserError(f"{file}: unreadable results table ({exc})") from None
            if not frame.empty:
                frames.append(frame.assign(run_dir=str(run_dir)) if with_run_dir else frame)
    if frames:
        # one block per dtype: frames with different columns concatenate into one block per column,
        # and a caller adding a column to that would trip pandas' fragmentation warning
        return pd.concat(frames, ignore_index=True).copy()
    return pd.DataFrame(columns=columns or [])


def contended(table: pd.DataFrame) -> pd.Series:
    """Rows marked `contended` (issue 12: the machine was busy with something else while they ran).
    Such a row is not comparable: history, nightly and compare leave it out. Results written before
    the column existed (or with it empty) are not contended."""
    if "contended" not in table:
        return pd.Series(False, index=table.index)
    return true_rows(table["contended"])


def contention_reason(table: pd.DataFrame) -> pd.Series:
    """The `contention` text of each row ("" where absent)."""
    return text_column(table, "contention")


def read_manifest(run_dir: Path) -> dict | None:
    """A run directory's manifest (None when it has none). Directories written before the format
    version existed are version 1; a newer layout than this reader knows is refused in one line."""
    path = Path(run_dir) / MANIFEST_FILE
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise UserError(f"{path}: unreadable manifest (invalid JSON)") from None
    if not isinstance(manifest, dict):
        raise UserError(f"{path}: unreadable manifest (expected a JSON object)")
    version = manifest.get("format_version", 1)
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise UserError(f"{path}: format_version {version!r} is newer than this amp_bench reads "
                        f"({FORMAT_VERSION}): upgrade amp_bench to read it")
    return manifest


def read_manifests(run_dirs: list[Path]) -> list[dict]:
    return [m for m in (read_manifest(d) for d in run_dirs) if m is not None]


def load_results(path: str | os.PathLike = "results") -> pd.DataFrame:
    """One row per case and repeat, from one run directory or a tree of them."""
    return _load(path, RESULTS_FILE, RESULT_COLUMNS)


def load_samples(path: str | os.PathLike = "results") -> pd.DataFrame:
    """Per-step samples (long format), from one run directory or a tree of them."""
    return _load(path, SAMPLES_FILE, SAMPLE_COLUMNS)


def _load(path, file_name: str, columns: list[str]) -> pd.DataFrame:
    table = read_table(find_run_dirs(path), file_name[: -len(".csv")], columns)
    if table.empty:
        raise UserError(f"{path}: no {file_name} found (expected a run directory or a tree of them)")
    return table
