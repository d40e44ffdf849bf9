"""pytest plugin (entry point `amp_bench`): gate on AMP cases with pytest-benchmark.

    def test_resnet_bf16(amp_benchmark):
        amp_benchmark("suites/smoke.yaml", "resnet18-bs4-32px-amp_bf16", device="cpu")

runs that case's real training step through `benchmark.pedantic` (warmup rounds = the suite's
warmup steps, rounds = its steps; the worker's host allocator setting, `cpu_allocator`, but not its
settle step: pytest-benchmark's warmup rounds are the suite's). On CUDA each timed call ends with a
device synchronise, so the wall clock pytest-benchmark reads is the step's real duration. The GPU and
environment go into `machine_info`, the case, per-step times and memory into `extra_info`;
`--benchmark-autosave` and `--benchmark-compare-fail` then work as for any benchmark.
"""
from __future__ import annotations

import pytest


@pytest.hookimpl(optionalhook=True)  # pytest-benchmark's hook: without it installed, pytest must still start
def pytest_benchmark_update_machine_info(config, machine_info):
    try:
        from amp_bench.platform.device import probe_device
        from amp_bench.platform.provenance import versions
        device, library_versions = probe_device(), versions()
    except Exception as exc:  # never break a benchmark session over the record
        machine_info["amp_bench"] = {"error": str(exc)}
        return
    machine_info["amp_bench"] = {"device": device.to_json(), "architecture": device.architecture,
                                 "versions": library_versions}


def run_case_in_benchmark(benchmark, suite_path, case_id: str, device: str = "auto", **overrides) -> dict:
    import torch

    from amp_bench.measure.case import build_step, prepare_case, seed_case
    from amp_bench.measure.devices import for_device
    from amp_bench.measure.step import UnsupportedCase
    from amp_bench.platform.device import precision_support, probe_device
    from amp_bench.suite import load_suite

    info = probe_device(device)
    suite = load_suite(suite_path)
    cases = {c.case_id: c for c in suite.cases(info.type, overrides)}
    if case_id not in cases:
        raise pytest.UsageError(f"{suite_path}: no case {case_id!r} on {info.type} (cases: {', '.join(cases)})")
    case = cases[case_id]
    torch_device = torch.device(info.torch_device)
    ops = for_device(torch_device)
    ops.make_current()
    # the worker's host allocator (a CPU keeps freed memory unless the suite says system); it stays set for
    # the rest of this pytest process, as the worker keeps it for its life
    record: dict = ops.tune_allocator(case)
    try:  # the worker's own set-up: the gate (decided here: this process plans the case), math flags,
        # cuDNN autotuning and the autocast proof
        prepare_case(case, info, record, precision_support(case.precision, info))
    except UnsupportedCase as exc:
        pytest.skip(f"{case_id}: unsupported here: {exc}")
    seed_case(case)
    step, inputs, target = build_step(case, info.type, torch_device, record)

    def one_step():
        step(inputs, target)
        ops.synchronize()  # pytest-benchmark reads a host clock: wait for the GPU

    ops.reset_peak_memory()
    benchmark.pedantic(one_step, rounds=case.steps, iterations=1, warmup_rounds=case.warmup_steps)
    extra = {"amp_bench_case": case.to_json(), "case_id": case_id, "suite": suite.name,
             "precision": case.precision, "batch_size": case.batch_size, "device": info.type,
             "device_name": info.name, "output_dtype": str(step.output_dtype).replace("torch.", ""),
             **{k: record[k] for k in ("emulated", "cudnn_benchmark", "tf32_matmul", "tf32_cudnn", "cpu_allocator")
                if k in record}}
    extra.update({k: v for k, v in ops.peak_memory_columns().items() if k.startswith("peak_mem_")})
    if step.scaler.is_enabled():
        extra["scaler_skipped_steps"] = len(step.skipped_steps(first=case.warmup_steps))
    stats = getattr(benchmark, "stats", None)
    rounds = getattr(getattr(stats, "stats", None), "data", None)
    if rounds:
        extra["step_times_ms"] = [t * 1e3 for t in rounds]  # per-step times, also without --benchmark-save-data
    benchmark.extra_info.update(extra)
    return extra


@pytest.fixture
def amp_benchmark(benchmark):
    """Callable: amp_benchmark(suite_path, case_id, device="auto", **suite_overrides) -> extra_info."""
    def run(suite_path, case_id: str, device: str = "auto", **overrides):
        return run_case_in_benchmark(benchmark, suite_path, case_id, device, **overrides)
    return run
