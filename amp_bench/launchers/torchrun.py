"""AMP under DistributedDataParallel, launched by PyTorch's own torchrun (torch.distributed.run).

Parent side: the torchrun command for a case (`launch_command`). Launcher: `python -m
amp_bench.launchers.torchrun launch TORCHRUN-ARGS...` is torchrun itself, run in-process after the worker's
die-with-parent guard, so that torchrun (and through it every rank) dies with the orchestrator.
Rank side (`Rank`, every rank's record aggregated into one row, weak scaling): measure/ddp.py.

torchrun starts each rank in a session of its own and closes inherited file descriptors, so the
parent's process-group kill does not reach the ranks, and the event pipe is not inherited; ranks
therefore carry die-with-parent too, rank 0 reopens the pipe through /proc, and the parent sweeps
up any process still carrying the case's token (process.py).
"""
from __future__ import annotations

import os
import re
import sys

from amp_bench.measure.ddp import rank_result_path, threads_per_rank

# --------------------------------------------------------------------------- parent side

def launch_command(case, rdzv_id: str) -> list[str]:
    """argv that runs `amp_bench.worker` on every rank of the case (append the worker's args)."""
    args = [sys.executable, "-m", "amp_bench.launchers.torchrun", "launch",
            f"--nproc-per-node={case.nproc_per_node}",
            "--max-restarts=0",  # a benchmark rank that fails must end the case, not restart it
            "--monitor-interval=0.1"]  # notice a dead rank (and stop the others) within 0.1 s
    if case.nnodes == 1:
        args.append("--standalone")  # c10d rendezvous on localhost, on a free port
    else:
        args += [f"--nnodes={case.nnodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint={case.rdzv_endpoint}",
                 f"--rdzv-id={rdzv_id}"]
    return args + ["-m", "amp_bench.worker"]


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
        why = f"rank {reports.get('rank')} of {world_size}: {reports.get('reason', '')}"
        return reports.get("status", "error"), why
    return None


def _is_peer_loss(reason: str) -> bool:
    """A collective that failed because another rank went away (gloo / NCCL wording)."""
    text = reason.lower()
    return any(m in text for m in ("connection closed", "connection reset", "broken pipe", "peer",
                                   "nccl communicator was aborted", "remote process exited"))


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
    from amp_bench.measure.ending import die_with_parent
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
    except Exception as exc:  # ChildFailedError: its text is the per-rank failure summary
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)  # the parent reads the root cause from it
        return 1
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["launch"]:
        return _launch(argv[1:])
    print("usage: python -m amp_bench.launchers.torchrun launch TORCHRUN-ARGS...", file=sys.stderr)
    return 2


if __name__ == "__main__":
    from amp_bench.measure.ending import exit_without_teardown
    exit_without_teardown(main(sys.argv[1:]))  # torchrun has reaped its ranks: skip tearing torch down
