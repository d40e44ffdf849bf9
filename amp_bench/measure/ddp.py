"""The rank side of AMP under DistributedDataParallel (the parent's side is launchers/torchrun.py).

`Rank`: this process's place in a torchrun job, process-group init/teardown, the DDP wrap; and the
aggregation of every rank's record into one result row: per step the slowest rank, global
throughput, memory as the max across ranks. Weak scaling throughout: the per-process batch stays the
suite's batch size."""
from __future__ import annotations

import os
from dataclasses import dataclass

# columns aggregated as the max across ranks (each rank measures its own process / GPU)
MAX_COLUMNS = (
    "peak_mem_allocated_bytes", "peak_mem_reserved_bytes", "rss_hwm_bytes", "rss_before_model_bytes",
    "cuda_num_alloc_retries", "peak_mem_forward_bytes", "peak_mem_backward_bytes", "peak_mem_optimizer_bytes",
    "nvml_mem_used_baseline_bytes", "nvml_mem_used_peak_bytes", "nvml_mem_used_delta_bytes",
    "nvml_mem_v2_used_peak_bytes", "nvml_mem_v2_reserved_bytes", "nvml_process_mem_peak_bytes",
    "temperature_c_max", "power_avg_w", "scaler_skipped_steps", "scaler_skipped_warmup_steps",
    "window_faulted_bytes_per_step", "settle_faulted_bytes",
)


MIN_COLUMNS = ("sm_clock_mhz_min", "mem_clock_mhz_min")


SUM_COLUMNS = ("energy_j", "energy_j_per_step")  # energy of the whole job: every GPU's


def threads_per_rank(case, cpu_count: int | None = None) -> int:
    """CPU threads each rank uses: the suite's threads_per_rank, else this node's cores shared out
    (torchrun alone would set OMP_NUM_THREADS=1 as soon as it starts more than one process)."""
    if case.threads_per_rank:
        return case.threads_per_rank
    if cpu_count is None:
        cpu_count = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cpu_count // (case.nproc_per_node or 1))


def rank_result_path(result_path: str, rank: int) -> str:
    return f"{result_path}.rank{rank}"


@dataclass
class Rank:
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    nnodes: int

    @classmethod
    def from_env(cls) -> Rank | None:
        """This process's place in the job when torchrun started it, else None."""
        env = os.environ
        if env.get("AMP_BENCH_DDP") != "1" or "RANK" not in env:  # only under our launcher
            return None
        world, local_world = int(env["WORLD_SIZE"]), int(env.get("LOCAL_WORLD_SIZE", env["WORLD_SIZE"]))
        return cls(int(env["RANK"]), int(env.get("LOCAL_RANK", 0)), world, local_world,
                   int(env.get("GROUP_WORLD_SIZE", max(1, world // max(1, local_world)))))

    def backend(self, case, device_type: str) -> str:
        if case.dist_backend != "auto":
            return case.dist_backend
        from amp_bench.measure.devices import ops_class
        return ops_class(device_type).dist_backend

    def check(self, case, device, backend: str) -> None:
        """Raises UnsupportedCase (on every rank alike, before any collective)."""
        from amp_bench.measure.devices import for_device
        from amp_bench.measure.step import UnsupportedCase
        ops = for_device(device.torch_device)
        if backend == "nccl" and ops.dist_backend != "nccl":
            raise UnsupportedCase(f"dist_backend nccl needs CUDA GPUs; the {ops.type.upper()} runs {ops.dist_backend}")
        why = ops.check_ranks(device, self.local_world_size)
        if why:
            raise UnsupportedCase(why)

    def init(self, backend: str, torch_device) -> None:
        import datetime
        self.device = torch_device

        import torch.distributed as dist
        kwargs = {"device_id": torch_device} if backend == "nccl" else {}
        # the case's timeout_s ends a hung collective first; this only bounds a lost peer
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=GROUP_TIMEOUT_S), **kwargs)

    def wrap(self, model, torch_device):
        from torch.nn.parallel import DistributedDataParallel

        from amp_bench.measure.devices import for_device
        return DistributedDataParallel(model, **for_device(torch_device).ddp_kwargs())

    def barrier(self) -> None:
        import torch.distributed as dist
        dist.barrier()

    def gather(self, obj) -> list:
        import torch.distributed as dist
        out = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def all_ready(self, ready: bool, timeout_s: float) -> bool:
        """Do all ranks agree (within `timeout_s`) that they are ready for a collective step?"""
        import datetime

        import torch
        import torch.distributed as dist
        flag = torch.tensor([1.0 if ready else 0.0], device=getattr(self, "device", "cpu"))
        work = dist.all_reduce(flag, op=dist.ReduceOp.MIN, async_op=True)
        work.wait(timeout=datetime.timedelta(seconds=timeout_s))
        return bool(flag.item() > 0)

    @staticmethod
    def teardown() -> None:
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


GROUP_TIMEOUT_S = 30 * 60  # init_process_group's timeout (Rank.init), restored after the profiled steps


def synced_steps(rank: Rank, profile, steps: int, median_ms: float | None) -> dict:
    """explain under DDP: the profiled steps of a DDP case with gradient sync, so the communication category
    holds the real all-reduce. Every rank first agrees it is ready (a rank whose instrumentation
    failed says no, and none profiles); during the steps the process group's timeout is cut to a
    bound on them (ten times their measured time, at least 60 s), so a rank that fails inside a step
    ends its peers' wait then instead of after 30 minutes; the row keeps its measurement either way."""
    import datetime

    import torch.distributed as dist
    guard_s = max(60.0, 10 * (steps + 1) * (median_ms or 0.0) / 1e3)
    try:
        if not rank.all_ready(True, guard_s):
            return {"explain_status": "unavailable", "explain_trace": "",
                    "explain_reason": "a rank was not ready for the profiled steps"}
        dist.set_timeout(datetime.timedelta(seconds=guard_s))
    except Exception as exc:  # the profile is an explanation, never a reason to lose the row
        return {"explain_status": "unavailable", "explain_trace": "",
                "explain_reason": f"the ranks did not agree to profile: {type(exc).__name__}: {exc}"[:300]}
    try:
        return profile()
    finally:
        dist.set_timeout(datetime.timedelta(seconds=GROUP_TIMEOUT_S))


def slowest_per_step(per_rank_ms: list[list[float]]) -> list[float]:
    """Step i of the job took as long as its slowest rank: DDP's all-reduce makes every rank wait
    for the last one, so the elementwise max over ranks is the job's step time."""
    lengths = {len(times) for times in per_rank_ms}
    if not per_rank_ms or len(lengths) != 1:
        raise ValueError(f"every rank must time the same number of steps, got {sorted(lengths)}")
    return [max(step) for step in zip(*per_rank_ms, strict=True)]


def aggregate(records: list[dict], case) -> dict:
    """One record for the job from every rank's (index = rank); what it was planned as is launch.base_row's."""
    from amp_bench.stats import StepStats, Window, achieved_rate, energy_rates, measured

    world = len(records)
    out = dict(records[0])
    per_rank = [[s["step_time_ms"] for s in measured(r.get("samples", []))] for r in records]
    slowest = slowest_per_step(per_rank)
    # the job's window ends when its last rank's does; throughput is global (every rank's samples)
    window = Window.from_steps(slowest, case.batch_size, seconds=max(r["window_s"] for r in records), world_size=world)
    stats = window.stats
    out.update(window.to_columns())
    out["samples"] = [dict(s) for s in records[0]["samples"]]
    for sample, step_ms in zip(measured(out["samples"]), slowest, strict=True):
        sample["step_time_ms"] = step_ms
    for column, pick in [(c, max) for c in MAX_COLUMNS] + [(c, min) for c in MIN_COLUMNS] + \
                        [(c, sum) for c in SUM_COLUMNS]:
        values = [r[column] for r in records if r.get(column) is not None]
        if values:
            out[column] = pick(values)
    if out.get("energy_j"):
        out.update(energy_rates(out["energy_j"], world * case.batch_size * case.steps))
    if out.get("flops_per_step") and stats.median:  # per-rank FLOPs at the job's step time: per-GPU MFU
        out.update(achieved_rate(out["flops_per_step"], stats.median, out.get("peak_tflops")))
        out["mfu_bf16_basis"] = achieved_rate(out["flops_per_step"], stats.median, out.get("peak_tflops_bf16"))["mfu"]
    out["rank_step_time_ms_medians"] = " ".join(f"{StepStats.from_samples(t).median:.4g}" for t in per_rank)
    warnings = [w for w in (stats.instability(),) if w]
    for rank, record in enumerate(records):
        for warning in filter(None, str(record.get("warnings") or "").split(" | ")):
            # the job's instability is judged on the aggregated times above, not per rank;
            # the window-gap note is per rank too and stays with its rank
            if not warning.startswith("unstable:"):
                warnings.append(f"rank {rank}: {warning}" if world > 1 else warning)
    out["warnings"] = " | ".join(dict.fromkeys(warnings))
    bad = next((r for r in records if r.get("status") != "ok"), None)
    if bad is not None:
        out["status"], out["reason"] = bad["status"], f"rank {records.index(bad)}: {bad.get('reason', '')}"
    return out
