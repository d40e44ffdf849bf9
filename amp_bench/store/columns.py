"""Every column of a run's tables, declared once: its name, in the file's order, its kind (`bool`,
`int`, `float`, `text`), its group and its one-line meaning, and the value read for a row written
before the column existed. results.csv's columns (RESULT_COLUMNS, with the explain and SLURM groups
inside it and NVML's from platform/nvml.py) and samples.csv's (SAMPLE_COLUMNS) are derived from the
declarations; results.py writes and reads them, a results row held to them (Row), and `typed` (store/typed.py)
reads them back typed. docs/results.md is generated from here (`python -m amp_bench.store.column_docs`)."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from amp_bench.errors import UserError
from amp_bench.identity import EAGER
from amp_bench.platform.nvml import NVML_COLUMNS
from amp_bench.stats import WORKER_PHASES, phase_column

BOOL, INT, FLOAT, TEXT = "bool", "int", "float", "text"
KINDS = (BOOL, INT, FLOAT, TEXT)


@dataclass(frozen=True)
class Column:
    name: str
    kind: str  # bool (True, False or unknown), int (nullable), float, text
    group: str  # a key of GROUPS
    meaning: str
    default: object = None  # read for a row written before the column existed (None: stays empty)


# The groups as the column reference presents them: key -> (title, what the whole group is).
GROUPS = {
    "case": ("Case", "what was measured, and how it ended"),
    "distributed": ("Distributed", "docs/distributed.md. Under DDP the step times are the slowest rank's per step, "
                    "`throughput` is global and memory/NVML figures are the max across ranks"),
    "time": ("Time", "the measured window and its step times"),
    "contention": ("Contention", "whether the machine was the case's to measure (docs/measuring.md)"),
    "memory": ("Memory", "CUDA allocator figures over the measured steps; the worker's RSS on the CPU"),
    "flops": ("FLOPs", "MFU only against a known dense peak for that exact GPU and math mode, or one you give "
              "with `peak_tflops:` / `--peak-tflops`; never a guess"),
    "nvml": ("NVML", "CUDA; empty, with `nvml_notes` saying why, when a call or the library is unavailable"),
    "numerics": ("Numerics", "the loss, the GradScaler and the math settings that were in force"),
    "compile": ("torch.compile", "empty for eager cases, whose `compile_mode` is `eager`; the summary adds "
                "`speedup_vs_eager`, `speedup_vs_fp32_eager` and `break_even_steps`"),
    "fp8": ("fp8", "docs/fp8.md; empty outside fp8 cases"),
    "provenance": ("Provenance", "versions, machine and worker; the manifest adds the full record"),
    "slurm": ("SLURM", "which job measured the case; empty in a local run (docs/cluster.md)"),
    "explain": ("Explain", "one profiled step's breakdown (docs/explain.md); empty unless `explain` is on, "
                "and taken in a case's first repeat only"),
    "phases": ("Worker phases", "where each worker's wall time went, launch to reap, in seconds; the phases add up "
               "to `worker_wall_s` (docs/measuring.md, \"Where a case's time goes\")"),
    "samples": ("samples.csv", "every step of every case and repeat"),
}


def _cols(group: str, specs: list[tuple]) -> list[Column]:
    return [Column(name, kind, group, meaning, *default) for name, kind, meaning, *default in specs]


_MS = "ms per profiled step in"
EXPLAIN_CATEGORIES = {  # analysis/explain/categories.py's CATEGORIES, in order (a test holds them equal)
    "gemm": "GEMMs (matmul, linear)", "conv": "convolutions", "attention": "fused attention kernels",
    "elementwise": "elementwise ops", "norm": "normalisation (batch, layer, group norm)",
    "reduction": "reductions (softmax, loss, sums, pooling)", "cast": "dtype-changing copies: autocast's own cost",
    "layout": "layout ops (contiguous, NCHW<->NHWC, memcpy/memset, cat, gather)",
    "optimizer": "the optimizer step (and GradScaler)", "communication": "NCCL/gloo collectives",
    "other": "anything the classifiers do not place",
}
_EXPLAIN = _cols("explain", [
    *((f"explain_{c}_ms", FLOAT, f"{_MS} {what}") for c, what in EXPLAIN_CATEGORIES.items()),
    ("explain_host_ms", FLOAT, "on a GPU the time the device sat idle; on a CPU the Python and framework time "
                               "between ops"),
    ("explain_busy_ms", FLOAT, "the profiled step's time in ops or kernels (the categories' sum)"),
    ("explain_profiled_ms", FLOAT, "the profiled step's wall time"),
    ("explain_profiled_vs_measured", FLOAT, "profiled step / measured median; above 1.5 the breakdown is distorted"),
    ("explain_cast_share", FLOAT, "share of the profiled step spent in casts"),
    ("explain_other_share", FLOAT, "share of the profiled step the classifiers left as other"),
    ("explain_misaligned_flop_share", FLOAT, "share of GEMM/conv FLOPs in layers whose dimensions are not multiples "
                                             "of 8 (16 for fp8)"),
    ("explain_misaligned_layers", TEXT, "those layers, with their FLOP share"),
    *((f"explain_phase_{p}_ms", FLOAT, f"{_MS} the {p} phase") for p in ("forward", "backward", "optimizer",
                                                                           "scaler")),
    ("explain_trace", TEXT, "the saved Chrome trace, relative to the run directory (Perfetto opens it)"),
    ("explain_status", TEXT, "ok, distorted or unavailable"),
    ("explain_reason", TEXT, "why the status is not ok"),
    ("explain_profiled_steps", INT, "how many steps were profiled"),
    ("explain_step_samples", TEXT, "every profiled step's ms per category (JSON): the noise rule's samples"),
    ("explain_tensor_core_share", FLOAT, "share of GEMM+conv time on Tensor Cores (CPU: on oneDNN's bf16/AMX "
                                         "kernels)"),
    ("explain_kernel_units", TEXT, "what ran where: the GEMM/conv time per kind of kernel"),
])
_SLURM = _cols("slurm", [
    ("slurm_partition", TEXT, "the partition"),
    ("slurm_job_id", TEXT, "the job (ARRAYJOB_TASK for an array task)"),
    ("slurm_array_job_id", TEXT, "the array job"),
    ("slurm_array_task_id", TEXT, "the array task"),
    ("slurm_node", TEXT, "the node"),
    ("slurm_job_gpus", TEXT, "the GPUs SLURM gave the job"),
])
_NVML = {  # platform/nvml.py's NVML_COLUMNS: kind and meaning (a test holds the two equal)
    "nvml_mem_used_baseline_bytes": (INT, "device-wide used memory before the model is built"),
    "nvml_mem_used_peak_bytes": (INT, "device-wide used memory, peak over the window"),
    "nvml_mem_used_delta_bytes": (INT, "peak - baseline"),
    "nvml_mem_v2_used_peak_bytes": (INT, "the v2 call's used memory, peak"),
    "nvml_mem_v2_reserved_bytes": (INT, "the v2 call's reserved memory"),
    "nvml_process_mem_peak_bytes": (INT, "this process's device memory, peak (empty when NVML cannot see this "
                                         "process, as in most containers)"),
    "nvml_samples": (INT, "NVML readings taken in the window"),
    "energy_j": (FLOAT, "energy over the measured window, J"),
    "energy_j_per_step": (FLOAT, "energy per measured step, J"),
    "energy_j_per_sample": (FLOAT, "energy per sample, J"),
    "samples_per_joule": (FLOAT, "samples per joule"),
    "power_avg_w": (FLOAT, "mean power over the window, W"),
    "power_limit_w": (FLOAT, "the enforced power limit, W"),
    "sm_clock_mhz_median": (FLOAT, "SM clock, median over the window, MHz"),
    "sm_clock_mhz_min": (FLOAT, "SM clock, lowest reading, MHz"),
    "mem_clock_mhz_median": (FLOAT, "memory clock, median, MHz"),
    "mem_clock_mhz_min": (FLOAT, "memory clock, lowest reading, MHz"),
    "temperature_c_max": (FLOAT, "GPU temperature, highest reading, C"),
    "gpu_util_pct_median": (FLOAT, "GPU utilisation, median, %"),
    "clock_event_reasons": (TEXT, "clock-event (throttle) reasons seen in the window, |-separated, or none"),
    "nvml_notes": (TEXT, "why NVML figures are empty"),
}
_NV = [Column(name, kind, "nvml", meaning) for name in NVML_COLUMNS for kind, meaning in [_NVML.get(name, ("", ""))]]

COLUMNS: list[Column] = [
    *_cols("case", [
        ("run_id", TEXT, "the run directory's name: UTC time, host, device"),
        ("suite", TEXT, "the suite's name"),
        ("case_id", TEXT, "the case: model label, batch size, size, precision, layout, processes, compile mode"),
        ("group_id", TEXT, "the case without its precision: the cases whose modes are compared"),
        ("model", TEXT, "`torchvision/<name>`, `transformers/<model_type>` or `python:<module>:<callable>`"),
        ("model_label", TEXT, "the model entry's label (its name in the case)"),
        ("batch_size", INT, "samples per step (per process under DDP)"),
        ("precision", TEXT, "fp32, tf32, amp_fp16, amp_bf16 or fp8"),
        ("channels_last", BOOL, "the channels_last memory format (image models)", False),
        ("image_size", INT, "input height and width in pixels (torchvision models; empty otherwise)"),
        ("seq_len", INT, "tokens per sample (transformers models; empty otherwise)"),
        ("device", TEXT, "cpu or cuda"),
        ("device_name", TEXT, "the GPU's or the CPU's name"),
        ("architecture", TEXT, "the GPU's generation (Volta ... Blackwell), or CPU"),
    ]),
    *_cols("distributed", [
        ("world_size", INT, "processes in the job (1: a plain process)", 1),
        ("nnodes", INT, "nodes", 1),
        ("nproc_per_node", INT, "processes per node under torchrun (empty for a plain process)"),
        ("dist_backend", TEXT, "gloo or nccl (empty for a plain process)"),
        ("scaling", TEXT, "weak: per-process batch fixed, or single process"),
        ("global_batch_size", INT, "samples per step across all processes"),
    ]),
    *_cols("case", [
        ("repeat", INT, "which repeat, from 0 (each in a fresh process)"),
        ("status", TEXT, "ok, unsupported, oom, error, timeout, nonfinite, compile_error, contended; a SLURM "
                         "job's end: cancelled, time_limit, preempted, node_fail, lost"),
        ("reason", TEXT, "why the status is not ok (the gate's reason, the exception's first line, SLURM's)"),
        ("warmup_steps", INT, "warmup steps asked for (not timed)"),
        ("steps", INT, "steps measured"),
    ]),
    *_cols("time", [
        ("stop_reason", TEXT, "why the window ended: precision reached, budget, max steps, fixed steps"),
        ("min_steps", INT, "never fewer measured steps (this wins over a budget)"),
        ("max_steps", INT, "never more measured steps"),
        ("target_ci", FLOAT, "the adaptive window's goal: the 95% interval of the median within +- this share"),
        ("case_budget_s", FLOAT, "seconds of measuring per case and repeat"),
        ("step_time_ms_median", FLOAT, "median step time over the measured window, ms"),
        ("step_time_ms_ci_low", FLOAT, "95% interval of the median (order statistics, no normality), low end"),
        ("step_time_ms_ci_high", FLOAT, "95% interval of the median, high end"),
        ("step_time_ms_mean", FLOAT, "mean step time, ms"),
        ("step_time_ms_p10", FLOAT, "10th percentile step time, ms"),
        ("step_time_ms_p90", FLOAT, "90th percentile step time, ms"),
        ("step_time_ms_iqr", FLOAT, "interquartile range of the step times, ms"),
        ("step_time_cv", FLOAT, "coefficient of variation of the step times"),
        ("step_time_ms_min", FLOAT, "fastest step, ms"),
        ("step_time_ms_max", FLOAT, "slowest step, ms"),
        ("throughput", FLOAT, "samples/s = samples in the measured window / window wall time, host gaps included: "
                              "the one throughput, which compare, history, nightly and the summary read"),
    ]),
    *_cols("distributed", [
        ("rank_step_time_ms_medians", TEXT, "each rank's median step time, ms, space-separated"),
    ]),
    *_cols("time", [
        ("window_s", FLOAT, "the measured window's wall time, s"),
        ("window_gap_fraction", FLOAT, "share of the window spent between steps"),
    ]),
    *_cols("contention", [
        ("contended", BOOL, "true, false, or empty: unknown (a window too short for /proc/stat to resolve)"),
        ("contention", TEXT, "why (or why unknown)"),
        ("cpu_share_available", FLOAT, "share of its threads' cores the worker could have had"),
        ("host_other_cpu_cores", FLOAT, "cores other processes used during the window"),
        ("steal_fraction", FLOAT, "hypervisor steal"),
        ("loadavg_1m", FLOAT, "the 1-minute load average"),
        ("gpu_other_processes", INT, "other processes on the GPU"),
    ]),
    *_cols("memory", [
        ("peak_mem_allocated_bytes", INT, "CUDA max_memory_allocated over the measured steps"),
        ("peak_mem_reserved_bytes", INT, "CUDA max_memory_reserved over the measured steps"),
        ("peak_rss_bytes", INT, "the worker's RSS high-water mark through the training steps"),
        ("peak_rss_lifetime_bytes", INT, "the parent's wait4 figure for the whole worker"),
        ("rss_before_model_bytes", INT, "the worker's RSS before the model was built (torch's own footprint)"),
        ("rss_hwm_bytes", INT, "the worker's VmHWM right after the window (what peak_rss_bytes is taken from)"),
        ("window_faulted_bytes_per_step", INT, "host memory the worker faulted in per measured step (minor page "
                                               "faults x page size): near 0 once the allocator keeps what it frees"),
        ("settle_steps", INT, "untimed steps between warmup and the window: CUDA one (cudnn.benchmark's workspaces "
                              "dropped); a CPU case that keeps freed memory, what warmup left of two steps (the "
                              "second still faults its memory in)"),
        ("settle_faulted_bytes", INT, "the memory the last CPU settle step faulted in"),
        ("nvml_mem_used_settled_bytes", INT, "NVML's device memory used after the CUDA settle step, as the window "
                                             "opens"),
        ("cuda_num_alloc_retries", INT, "the CUDA allocator's retries over the measured steps"),
        ("peak_mem_forward_bytes", INT, "peak in the forward pass of one instrumented step after the window"),
        ("peak_mem_backward_bytes", INT, "peak in its backward pass"),
        ("peak_mem_optimizer_bytes", INT, "peak in its optimizer step"),
        ("phase_memory_source", TEXT, "what the per-phase peaks are: the CUDA allocator's peak per phase, or the "
                                      "CPU RSS high-water mark (cpu_rss_hwm), which the allocator rarely gives back"),
    ]),
    *_cols("flops", [
        ("flops_per_step", INT, "torch's FlopCounterMode over one full step outside the window (a compiled model "
                                "is counted on its original module); the first repeat's, carried to later rows"),
        ("achieved_tflops", FLOAT, "flops_per_step / median step time"),
        ("peak_tflops", FLOAT, "the dense peak of this GPU in this mode"),
        ("mfu", FLOAT, "achieved / peak"),
        ("peak_tflops_source", TEXT, "where the peak comes from, starting with the rate used (fp8 dense peak: ...)"),
        ("peak_tflops_bf16", FLOAT, "the GPU's bf16 dense peak"),
        ("mfu_bf16_basis", FLOAT, "the same FLOPs against the bf16 peak: one basis for every mode (compare fp8 "
                                  "with bf16 on this)"),
    ]),
    *_NV,
    *_cols("numerics", [
        ("loss_first", FLOAT, "the first step's loss (warmup included)"),
        ("loss_last", FLOAT, "the last measured step's loss"),
        ("scaler_skipped_steps", INT, "GradScaler steps skipped in the measured window"),
        ("scaler_skipped_warmup_steps", INT, "GradScaler steps skipped in warmup"),
        ("scaler_final_scale", FLOAT, "the loss scale after the last step"),
        ("scaler_host_sync", BOOL, "GradScaler.step() synced host and device every step (an optimizer that cannot "
                                   "take the scale itself: found_inf read with .item())"),
        ("output_dtype", TEXT, "the model output's dtype: proof that autocast was on"),
        ("emulated", BOOL, "the mode ran in software on hardware without it (allow_emulated)"),
        ("emulated_reason", TEXT, "why the mode is emulated here"),
        ("tf32_matmul", BOOL, "torch.backends.cuda.matmul.allow_tf32"),
        ("tf32_cudnn", BOOL, "torch.backends.cudnn.allow_tf32"),
        ("cudnn_benchmark", BOOL, "cuDNN autotuning"),
        ("float32_matmul_precision", TEXT, "torch.get_float32_matmul_precision()"),
        ("fp32_precision_matmul", TEXT, "the newer fp32_precision API's value for matmul"),
        ("fp32_precision_cudnn_conv", TEXT, "... for cuDNN convolutions"),
        ("fp32_precision_cudnn_rnn", TEXT, "... for cuDNN RNNs"),
    ]),
    *_cols("compile", [
        ("compile_mode", TEXT, "eager, default, reduce-overhead or max-autotune", EAGER),
        ("compile_note", TEXT, "why the case is compiled when the suite's axis said eager (fp8_compile)"),
        ("compile_backend", TEXT, "torch.compile's backend (inductor, aot_eager, eager)"),
        ("compile_fullgraph", BOOL, "a graph break fails the case"),
        ("compile_optimizer", BOOL, "optimizer.step is compiled too"),
        ("compile_cache", TEXT, "warm (one inductor/triton cache per run, shared) or cold (an empty one per case)"),
        ("compile_cache_dir", TEXT, "that cache, inside the run directory"),
        ("compile_first_step_ms", FLOAT, "wall time of the first, compiling step, ms"),
        ("compile_time_s", FLOAT, "wall time of every warmup step that compiled, the first included, s"),
        ("compile_settled", BOOL, "compilation settled before the window (3 steps in a row compiled nothing new)"),
        ("warmup_steps_run", INT, "warmup steps run (warmup runs on until compilation settles)"),
        ("graph_breaks", INT, "graph breaks"),
        ("graph_break_reasons", TEXT, "the first three, |-separated"),
        ("recompiles", INT, "recompiles"),
        ("recompile_reasons", TEXT, "the first three"),
        ("recompiles_in_window", INT, "recompiles inside the measured window (also a warning: those steps include "
                                      "compile time)"),
        ("unique_graphs", INT, "graphs dynamo compiled"),
    ]),
    *_cols("fp8", [
        ("fp8_recipe", TEXT, "tensorwise or rowwise"),
        ("fp8_layers_converted", INT, "linear layers converted to float8"),
        ("fp8_layers_skipped", INT, "linear layers left out"),
        ("fp8_skip_reasons", TEXT, "the first four left out, by name and reason"),
        ("fp8_conv1d_as_linear", INT, "GPT-2 Conv1D layers replaced by nn.Linear"),
        ("fp8_matmul", TEXT, "torch._scaled_mm, or torchao emulation where _scaled_mm does not run"),
        ("fp8_torchao_version", TEXT, "the torchao version"),
    ]),
    *_cols("case", [
        ("optimizer", TEXT, "sgd, adam or adamw"),
        ("optimizer_impl", TEXT, "for-loop, foreach or fused"),
        ("seed", INT, "the seed"),
        ("num_threads", INT, "torch's intra-op threads in the worker"),
        ("omp_wait_policy", TEXT, "OMP_WAIT_POLICY as the worker had it (amp_bench leaves it as the user has it)"),
        ("cpu_allocator", TEXT, "a CPU case's host allocator: keep (freed memory kept for reuse, the default), "
         "system (glibc's defaults, or the LD_PRELOAD allocator named), or memory cap"),
    ]),
    *_cols("distributed", [
        ("threads_per_rank", INT, "CPU threads per rank"),
    ]),
    *_cols("case", [
        ("model_parameters", INT, "the model's parameter count"),
        ("model_attn_implementation", TEXT, "the attention implementation asked for (transformers)"),
        ("model_task", TEXT, "masked-lm, causal-lm or sequence-classification (transformers)"),
        ("variant", TEXT, "the advice item the case tries (`run --try`, e.g. optimizer_impl=fused): an axis of the "
                          "case; empty for a suite's own cases", ""),
    ]),
    *_cols("time", [
        ("warnings", TEXT, "|-separated: step-time CV >= 10%, GradScaler skips, host gaps, recompiles in the window"),
    ]),
    *_cols("provenance", [
        ("torch_version", TEXT, "torch"),
        ("cuda_version", TEXT, "torch's CUDA"),
        ("cudnn_version", TEXT, "cuDNN"),
        ("hostname", TEXT, "the host"),
        ("fingerprint", TEXT, "a hash of host, GPU, driver, CUDA and torch: rows with different fingerprints are "
                              "different series"),
    ]),
    *_SLURM,
    *_cols("provenance", [
        ("gpu_uuid", TEXT, "the GPU's UUID"),
        ("driver_version", TEXT, "the NVIDIA driver"),
        ("compute_capability", TEXT, "major.minor"),
        ("gpu_memory_bytes", INT, "the GPU's memory"),
        ("cpu_model", TEXT, "the CPU's model name"),
        ("cpu_count", INT, "the machine's logical CPUs (os.cpu_count())"),
        ("cpu_bf16_isa", TEXT, "the CPU's bf16/fp16 instructions, comma-separated (avx512_bf16, amx_bf16, "
                               "avx512_fp16, amx_fp16), or none"),
        ("timestamp", TEXT, "when the row was made (UTC, ISO 8601)"),
        ("worker_seconds", FLOAT, "the worker's wall time from its entry to its result, s (a lockstep member's: "
                                  "its own turns)"),
        ("worker_start", TEXT, "fork (a child of the run's fork server) or spawn (a fresh interpreter)"),
        ("worker_start_s", FLOAT, "from the worker's launch to its first step, s (a lockstep member's: less its "
                                  "wait for the first turn)"),
        ("interleave", TEXT, "steps: the repeat's modes ran as a lockstep set, their workers alive together and "
                             "taking turns of ~50 ms (window_s is this worker's own turns); repeats: one worker "
                             "after another"),
        ("log_file", TEXT, "the worker's log, relative to the run directory"),
    ]),
    *_cols("phases", [
        ("rerun_reason", TEXT, "why this row's case was run again at the end of its run: its pair's first run was "
                               "disturbed (stopped or measured as contended; that row's status and evidence). The "
                               "row replaces the first run's"),
        ("worker_window", INT, "which window of its worker the row is: 0 for a worker's first (or only) one; a "
                               "case's repeats that shared a worker (repeats_per_worker) share its log_file"),
        ("worker_wall_s", FLOAT, "the worker's wall time from its launch to its reap, by the parent's clock (a "
                                 "lockstep member's: to its own exit, its waits for partners included)"),
        *((phase_column(name), FLOAT, meaning) for name, meaning in WORKER_PHASES.items()),
    ]),
    *_EXPLAIN,
    *_cols("case", [
        ("model_vocab_size", INT, "the vocabulary's size (transformers)"),
        ("pytest_benchmark_name", TEXT, "the pytest-benchmark test an ingested row comes from (`ingest`)"),
        ("headroom_max_batch", BOOL, "the row measures a headroom search's largest batch (`headroom`)"),
    ]),
]
SAMPLE_DECLARED: list[Column] = _cols("samples", [
    ("run_id", TEXT, "the run"), ("case_id", TEXT, "the case"), ("precision", TEXT, "its precision"),
    ("repeat", INT, "the repeat"), ("phase", TEXT, "warmup or measure"), ("step", INT, "the step's index"),
    ("step_time_ms", FLOAT, "the step's time, ms"), ("loss", FLOAT, "the step's loss"),
])


def _table(spec: str) -> dict[str, str]:
    """'name name:i name:f name:b ...' -> {name: kind}, in the file's order: text unless marked int, float, bool."""
    marks = {"": TEXT, "i": INT, "f": FLOAT, "b": BOOL}
    return {name: marks[mark] for name, _, mark in (word.partition(":") for word in spec.split())}


# The study tables (docs/fidelity-and-headroom.md, docs/advice.md, docs/predict.md): each column's kind, in the
# file's order. The studies write them (studies/fidelity/, studies/headroom_search.py, studies/try_advice.py,
# studies/gpu_predictions.py); analysis/fidelity.py, analysis/headroom.py, benchmarks/advice_scores.py and the
# report read them. overhead.csv is benchmarks/overhead.py's rounds,
# harness against a plain loop, which the GPU check reads back.
STUDY_TABLES: dict[str, dict[str, str]] = {
    "fidelity": _table(
        "run_id suite dataset model precision seed:i status reason epochs:i steps:i batch_size:i train_examples:i "
        "test_examples:i test_accuracy:f test_loss:f train_accuracy:f final_train_loss:f loss_first:f "
        "scaler_initial_scale:f scaler_final_scale:f scaler_min_scale:f scaler_max_scale:f scaler_skipped_steps:i "
        "scaler_skipped_step_indices scaler_growth_steps:i scaler_scale_below_one:b grad_underflow_fraction_unscaled:f "
        "grad_underflow_fraction_scaled:f grad_zero_fraction_fp32:f grad_nonfinite_fraction_scaled:f output_dtype "
        "emulated:b optimizer lr:f compile_mode fp8_recipe fp8_layers_converted:i fp8_layers_skipped:i "
        "fp8_skip_reasons fp8_conv1d_as_linear:i fp8_matmul device device_name architecture torch_version "
        "data_source wall_s:f worker_start log_file hostname fingerprint timestamp"),
    "fidelity_steps": _table("run_id precision seed:i epoch:i step:i loss:f scale:f skipped:b"),
    "fidelity_epochs": _table("run_id precision seed:i epoch:i train_loss:f test_loss:f test_accuracy:f"),
    "fidelity_probes": _table(
        "run_id precision seed:i epoch:i step:i probe_scale:f grad_elements:i grad_zero_fraction_fp32:f "
        "grad_zero_fraction_unscaled:f grad_underflow_fraction_unscaled:f grad_nonfinite_fraction_unscaled:f "
        "grad_zero_fraction_scaled:f grad_underflow_fraction_scaled:f grad_nonfinite_fraction_scaled:f"),
    # fp8: per step, the amax of the first float8 layers' input and weight and the scale float8 derives from it
    "fidelity_fp8_scales": _table("run_id precision seed:i step:i layer tensor amax:f scale:f"),
    "headroom": _table(
        "run_id suite model_label image_size:i seq_len:i channels_last:b world_size:i nproc_per_node:i compile_mode "
        "precision device device_name status reason max_batch_size:i first_oom_batch_size:i limit_reached:b "
        "start_batch_size:i "
        "max_batch_size_limit:i resolution:i memory_cap_bytes:i probes:i batch_ratio_vs_fp32:f "
        "batch_ratio_is_lower_bound:b throughput_at_max:f step_time_ms_at_max:f peak_mem_at_max_bytes:i "
        "throughput_ratio_vs_fp32:f measure_status hostname fingerprint timestamp"),
    "headroom_probes": _table("run_id model_label precision probe:i batch_size:i status reason peak_mem_bytes:i "
                              "worker_seconds:f worker_start log_file"),
    "advice": _table(
        "run_id tried_run rule case_id variant_case_id precision device_name change predicted_speedup:f "
        "predicted_low:f predicted_high:f verdict measured_speedup:f measured_low:f measured_high:f pairs:i "
        "contended:b error:f evidence how source"),
    # what a run on a machine without a GPU predicts for its suite's GPU cases (studies/gpu_predictions.py): a
    # prediction, never a measurement; compare, nightly and the exports read results.csv only
    "predicted": _table(
        "case precision target target_label status reason step_ms:f step_ms_low:f step_ms_high:f throughput:f "
        "throughput_low:f throughput_high:f speedup:f speedup_low:f speedup_high:f baseline peak_memory_bytes:f "
        "memory_saving:f source interval_from"),
    # a change's gain on a GPU, priced on fake-tensor steps as is and changed (studies/gpu_advice.py)
    "predicted_advice": _table(
        "case precision model rule change target target_label status reason step_ms:f predicted_ms:f low_ms:f "
        "high_ms:f gain:f gain_low:f gain_high:f how"),
    "overhead": _table(
        "round:i device model image_size:i batch:i channels_last:b optimizer impl device_name precision warmup:i "
        "steps:i harness_throughput:f plain_throughput:f ratio:f harness_ms:f plain_ms:f harness_gap_fraction:f "
        "target:f"),
}

# The documented columns, in order; a file may carry more (a newer writer's, appended after these). Adding columns
# keeps FORMAT_VERSION: an older reader keeps unknown columns after its own, a newer one reads older
# files with the new columns empty (or their read default).
RESULT_COLUMNS = [c.name for c in COLUMNS]
EXPLAIN_COLUMNS = [c.name for c in _EXPLAIN]
SLURM_COLUMNS = [c.name for c in _SLURM]
SAMPLE_COLUMNS = [c.name for c in SAMPLE_DECLARED]
BY_NAME: dict[str, Column] = {c.name: c for c in COLUMNS}
READ_DEFAULTS = {c.name: c.default for c in COLUMNS if c.default is not None}
# every table the store reads back typed: name -> {column: kind}
TABLE_KINDS: dict[str, dict[str, str]] = {"results": {c.name: c.kind for c in COLUMNS},
                                          "samples": {c.name: c.kind for c in SAMPLE_DECLARED}, **STUDY_TABLES}
# int columns the typed read leaves float64 for now, until their readers outside store/ take Int64:
# image_size and seq_len are empty for the other kind of model, and amp_bench/identity.py's case_label
# compares them (`float(size) > 0`); memory in bytes and FLOPs are divided into savings, rates
# and MFU, and an empty one would be pd.NA where report/data.py's verdict asks `np.isfinite(value)`.
# The same holds for the study tables' sizes and bytes (read_as_float).
READ_AS_FLOAT = frozenset({"image_size", "seq_len", "flops_per_step",
                           *(c.name for c in COLUMNS if c.kind == INT and c.name.endswith("_bytes"))})


def read_as_float(name: str, kind: str) -> bool:
    return kind == INT and (name in READ_AS_FLOAT or name.endswith("_bytes"))


def order_columns(table: pd.DataFrame) -> pd.DataFrame:
    """The documented columns first (present even when empty), then any others a record carried."""
    return table.reindex(columns=RESULT_COLUMNS + [c for c in table.columns if c not in RESULT_COLUMNS])


_BOOLS, _INTS = (bool, np.bool_), (int, np.integer)  # a count read back as float (read_as_float) is a whole one
_FITS = {BOOL: lambda v: isinstance(v, _BOOLS), TEXT: lambda v: isinstance(v, str),
         INT: lambda v: not isinstance(v, _BOOLS) and (isinstance(v, _INTS) or isinstance(v, float) and v.is_integer()),
         FLOAT: lambda v: isinstance(v, (*_INTS, float, np.floating)) and not isinstance(v, _BOOLS)}


class RowError(UserError):
    """A column written twice, not declared, or not of its declared kind: the column and its writers named."""


class Row(Mapping):
    """A results row, the union of what its writers know (the plan, the worker, the launcher, the run's FLOPs and
    explain verdict, the machine): `put(by, columns)` each column once, `warn` a warning more; `check()`, as
    RunStore.add writes the row, holds every cell to its declaration (declared, of its kind). Read like a dict."""

    def __init__(self, by: str = "", columns: Mapping | None = None):
        self._cells, self._writers, self.held = {}, {}, {}  # held: columns another judges (an explain capture)
        self.put(by, columns or {})

    def put(self, by: str, columns: Mapping) -> Row:
        """RowError, and nothing put, when a column is already written."""
        twice = next((name for name in columns if name in self._writers), None)
        if twice is not None:
            raise RowError(f"{twice}: written twice, by {self._writers[twice]} and by {by}")
        self._cells.update(columns)
        self._writers.update(dict.fromkeys(columns, by))
        return self

    def warn(self, text: str) -> Row:
        """A warning after those put (the worker's): the one column several writers add to, in the order they came."""
        said = self._cells.get("warnings")
        self._cells["warnings"] = " | ".join(w for w in (said, text) if isinstance(w, str) and w)
        self._writers.setdefault("warnings", "a warning")
        return self

    def check(self) -> Row:
        for name, value in self._cells.items():
            column, by = BY_NAME.get(name), self._writers[name]
            if column is None:
                raise RowError(f"{name}: not a declared results column (store/columns.py), written by {by}")
            if not (value is None or value is pd.NA or value != value or _FITS[column.kind](value)):
                raise RowError(f"{name}: {type(value).__name__} {value!r} where {column.kind} is declared, "
                               f"written by {by}")
        return self

    def __getitem__(self, name: str):
        return self._cells[name]

    def __iter__(self):
        return iter(self._cells)

    def __len__(self) -> int:
        return len(self._cells)
