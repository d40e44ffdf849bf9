"""What a worker sends its parent, whatever it measures: progress events on the parent's pipe and its
result as a file written atomically. How a worker ends is measure/ending.py; its memory as the kernel
counts it, measure/procfs.py.

Imports nothing of amp_bench, so the worker entry point, the measurement, the fidelity training
and the torchrun launcher can all use it without import circles.
"""
from __future__ import annotations

import json
import os


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
