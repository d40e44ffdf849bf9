"""How a worker process ends: whether a failure was running out of memory (an ordinary `oom` row), dying
with the orchestrating parent, and exiting at once once its result is written. Imports nothing of amp_bench."""
from __future__ import annotations

import contextlib
import os
import sys

OOM_MARKERS = ("out of memory", "can't allocate memory", "not enough memory", "cudnn_status_alloc_failed",
               "cuda error: out of memory", "std::bad_alloc", "cublas_status_alloc_failed")


def is_oom(exc: BaseException) -> bool:
    import torch
    if isinstance(exc, (MemoryError, torch.OutOfMemoryError)):
        return True
    return isinstance(exc, RuntimeError) and any(m in str(exc).lower() for m in OOM_MARKERS)


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
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)
