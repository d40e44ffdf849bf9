"""The columns of a run's tables, in order: results.csv (RESULT_COLUMNS, with the explain and SLURM
groups) and samples.csv. results.py writes and reads them; every reader names them from here (or
through results.py, which imports them)."""
from __future__ import annotations

import pandas as pd

from amp_bench.platform.nvml import NVML_COLUMNS

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
    # issue 35: how many steps were profiled and every step's ms per category (JSON: the noise rule's
    # samples), the share of GEMM+conv time on Tensor Cores (CPU: on oneDNN's bf16/AMX kernels) and
    # what ran where
    "explain_profiled_steps", "explain_step_samples", "explain_tensor_core_share", "explain_kernel_units",
]
# Which SLURM job measured the case (studies/cluster.py; empty in a local run): executors/job_env.py writes them.
SLURM_COLUMNS = ["slurm_partition", "slurm_job_id", "slurm_array_job_id", "slurm_array_task_id", "slurm_node",
                 "slurm_job_gpus"]
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
    "optimizer", "optimizer_impl", "seed", "num_threads", "omp_wait_policy", "threads_per_rank", "model_parameters",
    "model_attn_implementation",
    "model_task", "warnings", "torch_version", "cuda_version", "cudnn_version", "hostname", "fingerprint",
    *SLURM_COLUMNS,
    "gpu_uuid", "driver_version", "compute_capability", "gpu_memory_bytes", "cpu_model", "cpu_count", "cpu_bf16_isa",
    "timestamp",
    "worker_seconds", "worker_start", "worker_start_s", "log_file", *EXPLAIN_COLUMNS,
]
SAMPLE_COLUMNS = ["run_id", "case_id", "precision", "repeat", "phase", "step", "step_time_ms", "loss"]


def order_columns(table: pd.DataFrame) -> pd.DataFrame:
    """The documented columns first (present even when empty), then any others a record carried."""
    return table.reindex(columns=RESULT_COLUMNS + [c for c in table.columns if c not in RESULT_COLUMNS])
