"""This process's memory as the kernel counts it: /proc/self/status lines (VmRSS, VmHWM, VmSize) and the
pages it faulted in (getrusage). Torch-free; imports nothing of amp_bench."""
from __future__ import annotations

import contextlib
import os


def read_status_bytes(key: str) -> int | None:
    with contextlib.suppress(OSError), open("/proc/self/status", encoding="ascii") as fh:
        return next((int(line.split()[1]) * 1024 for line in fh if line.startswith(key)), None)
    return None


def read_rss_bytes() -> int | None:
    return read_status_bytes("VmRSS:")


PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def faulted_bytes() -> int:
    """Memory this process has faulted in so far: its minor page faults (getrusage) times the page size.
    A fault is a page touched for the first time (or again, after the allocator handed it back)."""
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt * PAGE_BYTES
