"""AMP under DistributedDataParallel, launched by PyTorch's own torchrun (torch.distributed.run).

Parent side: the torchrun command for a case (`launch_command`). Launcher: `python -m
amp_bench.distributed launch TORCHRUN-ARGS...` is torchrun itself, run in-process after the worker's
die-with-parent guard, so that torchrun (and through it every rank) dies with the orchestrator.
Rank side (`Rank`): process group init/teardown, the DDP wrap, and the aggregation of every rank's
record into one result row: per step the slowest rank, global throughput, memory as the max across
ranks. Weak scaling throughout: the per-process batch stays the suite's batch size.

torchrun starts each rank in a session of its own and closes inherited file descriptors, so the
parent's process-group kill does not reach the ranks, and the event pipe is not inherited; ranks
therefore carry die-with-parent too, rank 0 reopens the pipe through /proc, and the parent sweeps
up any process still carrying the case's token (process.py).
"""
from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass

SCALING = "weak: per-process batch fixed"
# columns aggregated as the max across ranks (each rank measures its own process / GPU)
MAX_COLUMNS = (
    "peak_mem_allocated_bytes", "peak_mem_reserved_bytes", "rss_hwm_bytes", "rss_before_model_bytes",
    "cuda_num_alloc_retries", "peak_mem_forward_bytes", "peak_mem_backward_bytes", "peak_mem_optimizer_bytes",
    "nvml_mem_used_baseline_bytes", "nvml_mem_used_peak_bytes", "nvml_mem_used_delta_bytes",
    "nvml_mem_v2_used_peak_bytes", "nvml_mem_v2_reserved_bytes", "nvml_process_mem_peak_bytes",
    "temperature_c_max", "power_avg_w", "scaler_skipped_steps", "scaler_skipped_warmup_steps",
)
MIN_COLUMNS = ("sm_clock_mhz_min", "mem_clock_mhz_min")
SUM_COLUMNS = ("energy_j", "energy_j_per_step")  # energy of the whole job: every GPU's


# --------------------------------------------------------------------------- parent side

def launch_command(case, rdzv_id: str) -> list[str]:
    """argv that runs `amp_bench.worker` on every rank of the case (append the worker's args)."""
    args = [sys.executable, "-m", "amp_bench.distributed", "launch",
            f"--nproc-per-node={case.nproc_per_node}",
            "--max-restarts=0",  # a benchmark rank that fails must end the case, not restart it
            "--monitor-interval=0.1"]  # notice a dead rank (and stop the others) within 0.1 s
    if case.nnodes == 1:
        args.append("--standalone")  # c10d rendezvous on localhost, on a free port
    else:
        args += [f"--nnodes={case.nnodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint={case.rdzv_endpoint}",
                 f"--rdzv-id={rdzv_id}"]
    return args + ["-m", "amp_bench.worker"]


def threads_per_rank(case, cpu_count: int | None = None) -> int:
    """CPU threads each rank uses: the suite's threads_per_rank, else this node's cores shared out
    (torchrun alone would set OMP_NUM_THREADS=1 as soon as it starts more than one process)."""
    if case.threads_per_rank:
        return case.threads_per_rank
    if cpu_count is None:
        cpu_count = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cpu_count // (case.nproc_per_node or 1))


def launch_env(case) -> dict[str, str]:
    threads = str(threads_per_rank(case))
    return {"AMP_BENCH_DDP": "1", "OMP_NUM_THREADS": threads, "AMP_BENCH_THREADS_PER_RANK": threads,
            # gloo on one node: talk over loopback (the host name may resolve to an unroutable address)
            **({"GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME", "lo")} if case.nnodes == 1 else {})}


_FAILED_RANK = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank[^)]*\)\s*exitcode\s*:\s*(-?\d+)")


def torchrun_exits(log_text: str) -> dict[int, int]:
    """rank -> exit code of every failed rank, from torchrun's failure summary in the log."""
    return {int(rank): int(code) for rank, code in _FAILED_RANK.findall(log_text)}


def explain_failure(result_path, log_text: str, world_size: int) -> tuple[str, str] | None:
    """(status, reason) for a job that ended without a result, naming the rank that failed first.

    A rank that died without saying why (a signal, os._exit) is the cause: its peers then fail on
    the broken connection (and write their own account) or are stopped by torchrun (SIGTERM)."""
    import signal
    exits = torchrun_exits(log_text)
    reports = first_rank_failure(result_path, world_size)
    silent = sorted(r for r, code in exits.items() if code != -signal.SIGTERM
                    and (reports is None or r != reports.get("rank")))
    if silent and (reports is None or _is_peer_loss(reports.get("reason", ""))):
        rank, code = silent[0], exits[silent[0]]
        if code == -signal.SIGKILL:
            return "oom", (f"rank {rank} of {world_size} was killed by SIGKILL without a result (usually the "
                           "kernel's OOM killer); torchrun stopped the other ranks")
        if code < 0:
            return "error", (f"rank {rank} of {world_size} was killed by {signal.Signals(-code).name}; "
                             "torchrun stopped the other ranks")
        return "error", f"rank {rank} of {world_size} exited with code {code} without a result"
    if reports is not None:
        return reports.get("status", "error"), f"rank {reports.get('rank')} of {world_size}: {reports.get('reason', '')}"
    return None


def _is_peer_loss(reason: str) -> bool:
    """A collective that failed because another rank went away (gloo / NCCL wording)."""
    text = reason.lower()
    return any(m in text for m in ("connection closed", "connection reset", "broken pipe", "peer",
                                   "nccl communicator was aborted", "remote process exited"))


def rank_result_path(result_path: str, rank: int) -> str:
    return f"{result_path}.rank{rank}"


def first_rank_failure(result_path, world_size: int) -> dict | None:
    """The earliest failure a rank recorded itself (a rank that raised; not one that was killed).
    Earliest, because a peer's failure makes the others fail too (connection closed)."""
    import json
    found = []
    for rank in range(world_size):
        path = rank_result_path(str(result_path), rank)
        try:
            with open(path, encoding="utf-8") as fh:
                found.append(json.load(fh))
        except (OSError, ValueError):
            continue
    return min(found, key=lambda r: r.get("failed_at", float("inf"))) if found else None


# --------------------------------------------------------------------------- launcher

def _launch(argv: list[str]) -> int:
    from amp_bench.child import die_with_parent
    die_with_parent()
    fd = os.environ.pop("AMP_BENCH_EVENT_FD", None)
    if fd:  # torchrun closes inherited fds; rank 0 reopens this process's end of the pipe by path
        os.environ["AMP_BENCH_EVENT_PATH"] = f"/proc/{os.getpid()}/fd/{fd}"
    os.environ["AMP_BENCH_PARENT_PID"] = str(os.getpid())  # the ranks' parent is this process
    from torch.distributed.run import main
    try:
        main(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    except Exception as exc:  # noqa: BLE001 - ChildFailedError: its text is the per-rank failure summary
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)  # the parent reads the root cause from it
        return 1
    return 0


# --------------------------------------------------------------------------- rank side

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
        return "nccl" if device_type == "cuda" else "gloo"

    def cuda_index(self, device) -> int:
        return (device.index or 0) + self.local_rank

    def check(self, case, device, backend: str) -> None:
        """Raises UnsupportedCase (on every rank alike, before any collective)."""
        from amp_bench.step import UnsupportedCase
        if backend == "nccl" and device.type != "cuda":
            raise UnsupportedCase("dist_backend nccl needs CUDA GPUs; the CPU runs gloo")
        if device.type == "cuda":
            import torch
            count = torch.cuda.device_count()
            needed = (device.index or 0) + self.local_world_size
            if needed > count:
                raise UnsupportedCase(f"nproc_per_node={self.local_world_size} from {device.torch_device} needs "
                                      f"{needed} GPUs on this node, {count} visible")

    def init(self, backend: str, torch_device) -> None:
        import datetime

        import torch.distributed as dist
        kwargs = {"device_id": torch_device} if backend == "nccl" else {}
        # the case's timeout_s ends a hung collective first; this only bounds a lost peer
        dist.init_process_group(backend, timeout=datetime.timedelta(minutes=30), **kwargs)

    def wrap(self, model, torch_device):
        from torch.nn.parallel import DistributedDataParallel
        if torch_device.type == "cuda":
            return DistributedDataParallel(model, device_ids=[torch_device.index], output_device=torch_device.index)
        return DistributedDataParallel(model)

    def barrier(self) -> None:
        import torch.distributed as dist
        dist.barrier()

    def gather(self, obj) -> list:
        import torch.distributed as dist
        out = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    @staticmethod
    def teardown() -> None:
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


def slowest_per_step(per_rank_ms: list[list[float]]) -> list[float]:
    """Step i of the job took as long as its slowest rank: DDP's all-reduce makes every rank wait
    for the last one, so the elementwise max over ranks is the job's step time."""
    lengths = {len(times) for times in per_rank_ms}
    if not per_rank_ms or len(lengths) != 1:
        raise ValueError(f"every rank must time the same number of steps, got {sorted(lengths)}")
    return [max(step) for step in zip(*per_rank_ms)]


def aggregate(records: list[dict], case, backend: str) -> dict:
    """One row for the job from every rank's record (index = rank)."""
    from amp_bench.timing import StepStats, Window, measured

    world = len(records)
    out = dict(records[0])
    per_rank = [[s["step_time_ms"] for s in measured(r.get("samples", []))] for r in records]
    slowest = slowest_per_step(per_rank)
    # the job's window ends when its last rank's does; throughput is global (every rank's samples)
    window = Window.from_steps(slowest, case.batch_size, seconds=max(r["window_s"] for r in records),
                               world_size=world)
    stats = window.stats
    out.update(window.to_columns())
    out["samples"] = [dict(s) for s in records[0]["samples"]]
    slowest_steps = iter(slowest)
    for sample in measured(out["samples"]):
        sample["step_time_ms"] = next(slowest_steps)
    for column, pick in [(c, max) for c in MAX_COLUMNS] + [(c, min) for c in MIN_COLUMNS] + \
                        [(c, sum) for c in SUM_COLUMNS]:
        values = [r[column] for r in records if r.get(column) is not None]
        if values:
            out[column] = pick(values)
    if out.get("energy_j"):
        out["energy_j_per_sample"] = out["energy_j"] / (world * case.batch_size * case.steps)
        out["samples_per_joule"] = 1 / out["energy_j_per_sample"]
    if out.get("flops_per_step") and stats.median:  # per-rank FLOPs at the job's step time: per-GPU MFU
        out["achieved_tflops"] = out["flops_per_step"] / (stats.median / 1e3) / 1e12
        if out.get("peak_tflops"):
            out["mfu"] = out["achieved_tflops"] / out["peak_tflops"]
        if out.get("peak_tflops_bf16"):
            out["mfu_bf16_basis"] = out["achieved_tflops"] / out["peak_tflops_bf16"]
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
    out.update(world_size=world, nnodes=case.nnodes, dist_backend=backend, scaling=SCALING,
               global_batch_size=world * case.batch_size)
    return out


def main(argv: list[str]) -> int:
    if argv[:1] == ["launch"]:
        return _launch(argv[1:])
    print("usage: python -m amp_bench.distributed launch TORCHRUN-ARGS...", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
