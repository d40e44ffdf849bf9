"""Whether this process may fork workers. A fork copies one thread and the process's memory: a CUDA driver
that was initialised (cuInit, a context) does not survive it, NVML's state is the driver's too, and a
thread that held a lock when the fork happened leaves it held for ever in the child.

Loading a library is not initialising it. On a GPU host `import torch` maps the CUDA driver library
(libcublasLt and libcusparseLt dlopen `libcuda.so.1` as torch loads: seen with LD_DEBUG=libs, torch
2.11+cu130 and 2.14.1+cu130) in every process that imported torch, before any CUDA call; a rule that
refused whenever `libcuda.so` was mapped kept the fork server off every GPU host, and each worker paid
13-25 s of imports there (an H200, 2026-12-04). So a mapped driver library is asked, without
initialising it, whether it was initialised: cuDeviceGetCount answers CUDA_ERROR_NOT_INITIALIZED until
cuInit runs, and NVML's nvmlDeviceGetCount_v2 NVML_ERROR_UNINITIALIZED until nvmlInit. Torch-free: it
looks at torch only if something already imported it."""
from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path

CUDA_ERROR_NOT_INITIALIZED = 3
NVML_ERROR_UNINITIALIZED = 1
# the driver libraries (by the start of their file name), the call that answers without initialising,
# the answer that means "not initialised", and what an initialised one means for a fork
_DRIVERS = (("libcuda.so", "cuDeviceGetCount", CUDA_ERROR_NOT_INITIALIZED, "initialised the CUDA driver"),
            ("libnvidia-ml.so", "nvmlDeviceGetCount_v2", NVML_ERROR_UNINITIALIZED, "initialised NVML"))


def mapped_libraries(maps_text: str | None = None) -> dict[str, str]:
    """File name -> path of every library mapped into this process (/proc/self/maps)."""
    if maps_text is None:
        try:
            maps_text = Path("/proc/self/maps").read_text(errors="replace")
        except OSError:
            return {}
    found = {}
    for line in maps_text.splitlines():
        path = line.split(maxsplit=5)[5] if len(line.split(maxsplit=5)) == 6 else ""
        if path.startswith("/"):
            found.setdefault(path.rsplit("/", 1)[-1], path)
    return found


def driver_initialised(path: str, query: str, not_initialised: int) -> bool | None:
    """Ask an already-mapped driver library (RTLD_NOLOAD: never loads one) whether it was initialised: True,
    False, or None where it cannot be asked (no such symbol, another answer)."""
    try:
        library = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | ctypes.RTLD_GLOBAL)
        count = ctypes.c_uint(0)
        answer = getattr(library, query)(ctypes.byref(count))
    except (OSError, AttributeError):
        return None
    if answer == not_initialised:
        return False
    return True if answer == 0 else None


def thread_names(task_dir: str = "/proc/self/task") -> list[str]:
    """The names of this process's threads but the first (the one a fork keeps): a Python thread's own name,
    else the name the kernel has for it (a library's native thread: OpenMP's, a CUDA or NVML helper)."""
    try:
        tasks = sorted(os.listdir(task_dir), key=int)
    except (OSError, ValueError):
        return []
    threading = sys.modules.get("threading")
    python_names = {t.native_id: t.name for t in threading.enumerate()} if threading is not None else {}
    names = []
    for task in tasks[1:]:
        try:
            names.append(python_names.get(int(task)) or Path(task_dir, task, "comm").read_text().strip())
        except OSError:
            names.append(f"thread {task}")
    return names


def unsafe_to_fork(who: str = "the fork server", count_threads: bool = True) -> str:
    """Why this process (`who`, for the message) must not fork case workers ('' when it may): CUDA or NVML
    initialised here, or threads running (`count_threads` False: the driver only)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return f"an import initialised CUDA in {who}"
    libraries = mapped_libraries()
    for prefix, query, not_initialised, meaning in _DRIVERS:
        for name, path in libraries.items():
            if not name.startswith(prefix):
                continue
            state = driver_initialised(path, query, not_initialised)
            if state is not False:  # initialised, or a driver that cannot say: not safe to assume
                how = meaning if state else f"loaded {name}, which could not say whether it is initialised"
                return f"an import {how} in {who}"
    threads = thread_names()
    if count_threads and threads:
        shown = ", ".join(sorted(set(threads))[:4])
        return (f"{who} runs {len(threads) + 1} threads after its imports ({shown}); a fork keeps only one, "
                "and a lock one of them held stays held in every worker")
    return ""
