"""Whether this process may fork workers: a fork copies one thread and whatever CUDA state the process
holds, so a process that initialised CUDA (or loaded its driver) or runs other threads must not.
Torch-free: it looks at torch only if something already imported it."""
from __future__ import annotations

import os
import sys
from pathlib import Path

_CUDA_LIBRARIES = ("libcuda.so", "libnvidia-ml.so")


def unsafe_to_fork(who: str = "the fork server", count_threads: bool = True) -> str:
    """Why this process (`who`, for the message) must not fork case workers ('' when it may): CUDA
    touched, or threads running (`count_threads` False: CUDA only)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return f"an import initialised CUDA in {who}"
    try:
        maps = Path("/proc/self/maps").read_text(errors="replace")
    except OSError:
        maps = ""
    touched = [lib for lib in _CUDA_LIBRARIES if lib in maps]
    if touched:
        return f"an import loaded the CUDA driver ({', '.join(touched)}) in {who}"
    threads = len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else 1
    if count_threads and threads > 1:
        return f"{who} runs {threads} threads after its imports (a fork keeps only one)"
    return ""
