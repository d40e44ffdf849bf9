"""AMP under DistributedDataParallel, launched by PyTorch's own torchrun (torch.distributed.run).

Parent side: the torchrun command for a case (`launch_command`). Launcher: `python -m
amp_bench.launchers.torchrun launch TORCHRUN-ARGS...` is torchrun itself, run in-process after the worker's
die-with-parent guard, so that torchrun (and through it every rank) dies with the orchestrator.
Rank side (`Rank`, every rank's record aggregated into one row, weak scaling): measure/ddp.py.

The launcher is a child of the run's fork server where the run has one (else a fresh interpreter), so what every
rank imports (torch, torch._dynamo, the measuring modules, the model library: 4-5 s of CPU a process on a 2-core VM)
is imported once a run; ranks are forked from it: torchrun's agent gets a function
entrypoint with its `fork` start method; where those imports leave it more than one thread or touch CUDA
(platform/forking.py), torchrun starts each rank as a fresh interpreter, in a session of its own with inherited
descriptors closed. Either way ranks carry die-with-parent too, rank 0 reopens the event pipe through /proc,
and the parent sweeps up any process still carrying the case's token (process.py).
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import sys

from amp_bench.measure.ddp import rank_result_path, threads_per_rank

# --------------------------------------------------------------------------- parent side

def launch_command(case, rdzv_id: str, log_dir) -> list[str]:
    """argv that runs `amp_bench.worker` on every rank of the case (append the worker's args). torchrun's folders
    for each rank's logs go in `log_dir`: left to torchrun, they are a /tmp/torchelastic_* a case, never removed."""
    args = [sys.executable, "-m", "amp_bench.launchers.torchrun", "launch", f"--log-dir={log_dir}",
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
    found = []
    for rank in range(world_size):
        path = rank_result_path(str(result_path), rank)
        with contextlib.suppress(OSError, ValueError), open(path, encoding="utf-8") as fh:
            found.append(json.load(fh))
    return min(found, key=lambda r: r.get("failed_at", float("inf"))) if found else None


# --------------------------------------------------------------------------- launcher

_EXITS = None  # a launcher's RankExits, when it forks its ranks (which inherit it)


def _launch(argv: list[str]) -> int:
    from amp_bench.measure.ending import die_with_parent
    die_with_parent()
    fd = os.environ.pop("AMP_BENCH_EVENT_FD", None)
    if fd:  # torchrun closes inherited fds; rank 0 reopens this process's end of the pipe by path
        os.environ["AMP_BENCH_EVENT_PATH"] = f"/proc/{os.getpid()}/fd/{fd}"
    os.environ["AMP_BENCH_PARENT_PID"] = str(os.getpid())  # the ranks' parent is this process
    unsafe = _import_what_ranks_import(argv)
    from torch.distributed.run import main
    try:
        if unsafe:
            print(f"torchrun launcher: each rank starts as a fresh interpreter: {unsafe}", file=sys.stderr, flush=True)
            main(argv)
        else:
            _launch_forked(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    except Exception as exc:  # ChildFailedError: its text is the per-rank failure summary
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)  # the parent reads the root cause from it
        if _EXITS is not None:  # forked ranks: every one that ended badly (RankExits)
            _EXITS.peek()
            print(_EXITS.summary(), file=sys.stderr)
        return 1
    return 0


def _import_what_ranks_import(argv: list[str]) -> str:
    """Import what a rank of this case imports; why its ranks may not be forked from here ('' when they may)."""
    from amp_bench.platform.forking import unsafe_to_fork
    try:
        worker_args = argv[argv.index("amp_bench.worker") + 1:]
        with open(worker_args[1], encoding="utf-8") as fh:
            case = json.load(fh)["case"]
    except (ValueError, IndexError, OSError, KeyError) as exc:
        return f"no case spec to read ({type(exc).__name__})"
    from unittest import mock

    from amp_bench.launchers.forkserver import import_modules
    from amp_bench.suite.model_refs import preload_modules
    # as the fork server imports (forkserver.server_env): OpenMP's pool held back, CUDA asked through NVML
    with mock.patch.dict(os.environ, {"OMP_NUM_THREADS": "1", "PYTORCH_NVML_BASED_CUDA_CHECK": "1"}):
        import_modules(preload_modules([case["model"]["ref"]]) + ["torch.distributed.run"], case.get("search_dirs", []))
    return unsafe_to_fork("the torchrun launcher")


def _launch_forked(argv: list[str]) -> None:
    """torchrun's own launch (torch.distributed.run.run), each rank forked from this process."""
    import uuid

    from torch.distributed.launcher.api import elastic_launch
    from torch.distributed.run import config_from_args, parse_args
    args = parse_args(argv)
    if args.standalone:  # as torch.distributed.run.run does: c10d on localhost, a free port
        args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id = "c10d", "localhost:0", str(uuid.uuid4())
    config, _, _ = config_from_args(args)
    config.start_method = "fork"
    global _EXITS
    _EXITS = RankExits()
    elastic_launch(config=config, entrypoint=_forked_rank)(*args.training_script_args)


class RankExits:
    """How each forked rank ended: torchrun's agent names only the first failed one it reaps, often a peer that
    failed on the closed connection of a rank killed outright. Each rank writes its rank and pid to a pipe as it
    starts; on SIGCHLD the launcher peeks at their exits (waitid WNOWAIT: the agent still reaps them)."""

    def __init__(self):
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.read_fd, False)
        self.pending, self.pids, self.exits = b"", {}, {}  # pid -> rank; rank -> (pid, exit code, -N: signal N)
        import signal
        signal.signal(signal.SIGCHLD, lambda *_: self.peek())

    def started(self, rank: int) -> None:
        """In a forked rank: say which rank this pid is; the signal handling of a fresh interpreter (not the
        agent's, which turns the SIGTERM it stops ranks with into an exception; nor this watch)."""
        import signal
        for signum in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
            signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.close(self.read_fd)
        os.write(self.write_fd, f"{rank} {os.getpid()}\n".encode())
        os.close(self.write_fd)

    def peek(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            self.pending += os.read(self.read_fd, 65536)
        *lines, self.pending = self.pending.split(b"\n")
        self.pids.update({int(pid): int(rank) for rank, pid in (line.split() for line in lines)})
        for pid, rank in self.pids.items():
            with contextlib.suppress(ChildProcessError):  # reaped before this peek: the agent's summary names it
                ended = rank not in self.exits and os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
                if ended:  # None while it runs
                    killed = ended.si_code in (os.CLD_KILLED, os.CLD_DUMPED)
                    self.exits[rank] = (pid, -ended.si_status if killed else ended.si_status)

    def summary(self) -> str:
        """The ranks that ended badly, in the lines of torchrun's failure summary."""
        return "\n".join(f"rank : {rank} (local_rank: -) exitcode : {code} (pid: {pid})"
                         for rank, (pid, code) in sorted(self.exits.items()) if code != 0)


def _forked_rank(*worker_args: str) -> int:
    """One rank, forked: the worker's main, run as the fork server runs the worker (the program a launcher starts,
    not a library it imports), with a fresh rank's thread count. It returns: torchrun's agent collects every
    rank's return value (a failed rank has already exited)."""
    import runpy

    from amp_bench.launchers.forkserver import set_fresh_thread_count
    _EXITS.started(int(os.environ["RANK"]))
    set_fresh_thread_count()
    code = runpy.run_module("amp_bench.worker")["main"](list(worker_args))
    if code:
        from amp_bench.measure.ending import exit_without_teardown
        exit_without_teardown(code)
    return code


def main(argv: list[str]) -> int:
    if argv[:1] == ["launch"]:
        return _launch(argv[1:])
    print("usage: python -m amp_bench.launchers.torchrun launch TORCHRUN-ARGS...", file=sys.stderr)
    return 2


if __name__ == "__main__":
    from amp_bench.measure.ending import exit_without_teardown
    exit_without_teardown(main(sys.argv[1:]))  # torchrun has reaped its ranks: skip tearing torch down
