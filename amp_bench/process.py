"""Where a case runs: a fresh, killable worker process with a deadline and captured logs.

The worker gets its own session (process group), so a timeout or Ctrl-C kills it and anything it
started, and the terminal's Ctrl-C reaches only the parent. The parent reaps it with os.wait4 to read
its peak RSS (ru_maxrss). Progress events arrive on a dedicated pipe; we wait on it with select, so
there is no busy loop.
"""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable


@dataclass
class WorkerOutcome:
    result: dict | None  # what the worker wrote, None when it died first
    exit_code: int | None  # negative: killed by that signal
    timed_out: bool
    peak_rss_bytes: int | None
    wall_s: float
    log_path: Path


def _worker_env(event_fd: int) -> dict[str, str]:
    env = dict(os.environ)
    env["AMP_BENCH_EVENT_FD"] = str(event_fd)
    env["AMP_BENCH_PARENT_PID"] = str(os.getpid())
    env.setdefault("HF_HUB_OFFLINE", "1")  # no network at run time, ever
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env["PYTHONUNBUFFERED"] = "1"
    # the worker must import the same amp_bench as the parent, installed or not
    package_root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    return env


def run_worker(args: list[str], result_path: Path, log_path: Path, timeout_s: float,
               on_event: Callable[[dict], None] | None = None) -> WorkerOutcome:
    """Run `python -m amp_bench.worker ARGS...`; never raises for worker failures.

    KeyboardInterrupt in the parent kills the worker's process group and propagates.
    """
    result_path.unlink(missing_ok=True)
    read_fd, write_fd = os.pipe()
    started = time.monotonic()
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "amp_bench.worker", *args],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            env=_worker_env(write_fd), pass_fds=(write_fd,), start_new_session=True,
        )
    os.close(write_fd)
    timed_out = False
    try:
        timed_out = not _pump_events(read_fd, started + timeout_s, on_event)
        if timed_out:
            _kill_group(proc.pid)
    except BaseException:
        _kill_group(proc.pid)
        _reap(proc)
        raise
    finally:
        os.close(read_fd)
    exit_code, peak_rss = _reap(proc)
    result = None
    if result_path.exists() and not timed_out:
        try:
            result = json.loads(result_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            result = None
    return WorkerOutcome(result, exit_code, timed_out, peak_rss, time.monotonic() - started, log_path)


def _pump_events(fd: int, deadline: float, on_event) -> bool:
    """Forward events until the worker closes the pipe (True) or the deadline passes (False)."""
    buffer = b""
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        ready, _, _ = select.select([fd], [], [], remaining)
        if not ready:
            return False
        chunk = os.read(fd, 65536)
        if not chunk:
            return True
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            if on_event and line.strip():
                try:
                    on_event(json.loads(line))
                except ValueError:
                    pass


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _reap(proc: subprocess.Popen) -> tuple[int | None, int | None]:
    """Wait for the worker and return (exit code, peak RSS in bytes) from its rusage."""
    try:
        _, status, usage = os.wait4(proc.pid, 0)
    except ChildProcessError:
        return proc.poll(), None
    proc.returncode = os.waitstatus_to_exitcode(status)
    _kill_group(proc.pid)  # grandchildren the worker left behind
    return proc.returncode, usage.ru_maxrss * 1024  # ru_maxrss is KiB on Linux
