"""What every worker process shares, whatever it measures: the progress-event channel, atomic
result files, OOM classification, /proc memory readings, and dying with the orchestrating parent.

Imports nothing of amp_bench, so the worker entry point, the measurement, the fidelity training
and the torchrun launcher can all use it without import circles.
"""
from __future__ import annotations

import json
import os
import sys

OOM_MARKERS = ("out of memory", "can't allocate memory", "not enough memory", "cudnn_status_alloc_failed",
               "cuda error: out of memory", "std::bad_alloc", "cublas_status_alloc_failed")


class EventChannel:
    """JSON lines on the parent's event pipe. `member`: a lockstep member's place in its set
    (measure/conductor.py); the members share their conductor's pipe, so each event says whose it is
    (a line under PIPE_BUF is written whole)."""

    def __init__(self, fd: int | None, member: int | None = None):
        if fd is not None:
            os.set_inheritable(fd, False)  # a process the model starts must not hold the pipe open
        self._file = os.fdopen(fd, "w", buffering=1) if fd is not None else None
        self.member = member

    def emit(self, **event) -> None:
        if self.member is not None:
            event["member"] = self.member
        if self._file is not None:
            try:
                self._file.write(json.dumps(event) + "\n")
            except (BrokenPipeError, OSError):
                self._file = None  # the parent stopped listening; keep measuring


def write_json_atomic(path: str, data: dict) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh, default=str)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def is_oom(exc: BaseException) -> bool:
    import torch
    if isinstance(exc, (MemoryError, torch.OutOfMemoryError)):
        return True
    return isinstance(exc, RuntimeError) and any(m in str(exc).lower() for m in OOM_MARKERS)


def read_status_bytes(key: str) -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def read_rss_bytes() -> int | None:
    return read_status_bytes("VmRSS:")


PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def faulted_bytes() -> int:
    """Memory this process has faulted in so far: its minor page faults (getrusage) times the page size.
    A fault is a page touched for the first time (or again, after the allocator handed it back)."""
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt * PAGE_BYTES


def die_with_parent() -> None:
    """Linux: have the kernel kill this worker if the orchestrating parent dies (even by SIGKILL),
    so no orphaned worker keeps a GPU or CPU busy."""
    parent = os.environ.get("AMP_BENCH_PARENT_PID")
    if not sys.platform.startswith("linux") or not parent:
        return
    try:
        import ctypes
        import signal
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != int(parent):  # the parent died before prctl took effect
        os._exit(1)


def exit_without_teardown(code: int) -> None:
    """End a process that holds torch at once, its output flushed: tearing the interpreter down
    (module finalizers, torch's and oneDNN's caches) took 1.5-2 s of CPU a process on a 2-core VM,
    and every worker, rank, torchrun launcher and fork server paid it after its result was written.
    A process it started is ended by whoever owns its session (the parent's sweep of the case's token)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)
