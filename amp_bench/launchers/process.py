"""Where a case runs: a fresh, killable worker process with a deadline and captured logs.

The worker gets its own session (process group), so a timeout or Ctrl-C kills it and anything it
started, and the terminal's Ctrl-C reaches only the parent. The parent reaps it with os.wait4 to read
its peak RSS (ru_maxrss). Progress events arrive on a dedicated pipe; the parent waits on that pipe
and on a pidfd for the process together, so there is no busy loop.
"""
from __future__ import annotations

import contextlib
import itertools
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


@dataclass
class WorkerOutcome:
    result: dict | None  # what the worker wrote, None when it died first
    exit_code: int | None  # negative: killed by that signal
    timed_out: bool
    peak_rss_bytes: int | None
    wall_s: float
    log_path: Path
    started_by: str = "spawn"  # spawn: a fresh interpreter; fork: a child of the run's fork server
    contention: str = ""  # why the parent stopped it early as contended (launchers/busy.py), '' if it did not
    contention_seen: str = ""  # not stopped, but starved over its life (busy.ContentionWatch.lifetime)
    ended_at: float | None = None  # time.time() once it was reaped (the `exit` phase ends here)


_tokens = itertools.count()
# OpenMP's wait policy is left as the user has it (GNU OpenMP's default: spin a while, then sleep), as in
# their own training. Measured on a 2-core EPYC, ResNet-50 bs 8 (median of 3 processes, 5 steps each):
# quiet, PASSIVE made fp32 steps 3% and bf16 steps 6% slower than the default (the bf16 speedup 1.57x
# against 1.71x: shorter steps wait at more barriers); beside one busy process it made them 1.8x and 1.3x
# faster than the default's 3.5x and 3.4x slowdowns, but such a case is stopped as contended anyway
# (launchers/busy.py). OMP_WAIT_POLICY=PASSIVE in the environment is passed through; every row records it.


def package_pythonpath(existing: str = "") -> str:
    """PYTHONPATH for a worker: the same amp_bench as the parent's, installed or not; a folder named twice is
    named once, where Python looks first (the same search path, spelled as a zygote started without it has it)."""
    package_root = str(Path(__file__).resolve().parents[2])
    return os.pathsep.join(dict.fromkeys(p for p in (package_root, *existing.split(os.pathsep)) if p))


def worker_env(event_fd: int, token: str, environ=None) -> dict[str, str]:
    """A worker's environment: the parent's, with its event pipe, its case token, the no-network
    switches and the moment it was launched (for worker_start_s)."""
    env = dict(os.environ if environ is None else environ)
    env["AMP_BENCH_EVENT_FD"] = str(event_fd)
    env["AMP_BENCH_CASE_TOKEN"] = token  # inherited by everything the case starts: see _sweep
    env["AMP_BENCH_PARENT_PID"] = str(os.getpid())
    env["AMP_BENCH_LAUNCHED_AT"] = repr(time.time())
    env.setdefault("HF_HUB_OFFLINE", "1")  # no network at run time, ever
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = package_pythonpath(env.get("PYTHONPATH", ""))
    return env


def run_worker(args: list[str], result_path: Path, log_path: Path, timeout_s: float,
               on_event: Callable[[dict], None] | None = None, launcher: list[str] | None = None,
               extra_env: dict[str, str] | None = None, contention=None) -> WorkerOutcome:
    """Run `python -m amp_bench.worker ARGS...` (or `LAUNCHER... ARGS...`, e.g. torchrun starting
    the worker on every rank); never raises for worker failures.

    The deadline holds until the worker process has exited, not just until it closes its event
    pipe (a DDP rank's teardown can hang on a peer; a launcher's exit on what it waits for). KeyboardInterrupt in the
    parent kills the worker's process group and propagates. `contention(pid)` gives a watch
    (launchers/busy.ContentionWatch) that may stop the worker early; its evidence is in the outcome.
    """
    result_path.unlink(missing_ok=True)
    command = [*(launcher or [sys.executable, "-m", "amp_bench.worker"]), *args]
    proc, read_fd, token, started, watch = start_worker(
        lambda env, write_fd, log_fd: subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log_fd,
                                                       stderr=subprocess.STDOUT, env=env, pass_fds=(write_fd,),
                                                       start_new_session=True),
        log_path, extra_env, contention)
    deadline_hit, stopped = False, ""
    try:
        exited = _wait(proc.pid, read_fd, started + timeout_s, _watched(on_event, watch), watch)
        if isinstance(exited, str):  # the watch's evidence: stopped early as contended
            stopped = exited
        if not isinstance(exited, tuple):
            deadline_hit = not stopped
            _kill_group(proc.pid)
            exited = os.wait4(proc.pid, 0)
    except BaseException:
        _kill_group(proc.pid)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(proc.pid, 0)
        _sweep(token)
        raise
    finally:
        os.close(read_fd)
    _kill_group(proc.pid)  # anything the worker left behind in its group
    _sweep(token)  # and anything that left the group (torchrun starts each rank in its own session)
    _, status, usage = exited
    proc.returncode = os.waitstatus_to_exitcode(status)
    found = outcome(result_path, proc.returncode, deadline_hit, usage.ru_maxrss, started, log_path, timeout_s)
    return with_contention(found, stopped, watch)


def start_worker(start, log_path: Path, extra_env: dict[str, str] | None, contention):
    """What both ways of starting a worker share (run_worker here, forkserver's fork): its event pipe and
    case token in its environment, its log opened for appending, `start(env, write_fd, log_fd)` (a
    subprocess or the fork server's child: anything with a pid), the pipe's writing end closed here
    either way, and the contention watch's first reading as it starts, so its whole life can be judged.
    Returns (child, the pipe's reading end, token, the monotonic start, the watch or None)."""
    token = f"{os.getpid()}-{next(_tokens)}-{time.monotonic_ns()}"
    read_fd, write_fd = os.pipe()
    env = {**worker_env(write_fd, token), **(extra_env or {})}
    started = time.monotonic()
    try:
        with open(log_path, "ab") as log:
            child = start(env, write_fd, log.fileno())
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)
    watch = contention(child.pid) if contention is not None else None
    if watch is not None:
        watch.check()
    return child, read_fd, token, started, watch


def with_contention(found: WorkerOutcome, stopped: str, watch) -> WorkerOutcome:
    """The outcome with why the watch stopped the worker ('' if it did not), or else what it saw over
    the worker's life (launchers/busy.ContentionWatch.lifetime)."""
    found.contention = stopped
    found.contention_seen = watch.lifetime() if watch is not None and not stopped else ""
    return found


def _watched(on_event, watch):
    """The events go to the caller and to the contention watch (which stops watching after the window)."""
    if watch is None:
        return on_event

    def both(event: dict) -> None:
        watch.on_event(event)
        if on_event is not None:
            on_event(event)
    return both


def outcome(result_path: Path, exit_code: int | None, deadline_hit: bool, maxrss_kib: int | None, started: float,
            log_path: Path, timeout_s: float, started_by: str = "spawn") -> WorkerOutcome:
    """What the worker left: its result file (None when it died first), how it ended, its peak RSS."""
    try:
        result = json.loads(result_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # none written (it died first), or unreadable
        result = None
    if deadline_hit and result is not None:  # measured fine, then hung while shutting down
        note = f"worker hung after writing its result and was killed at timeout_s={timeout_s:g}"
        result["warnings"] = " | ".join(w for w in (result.get("warnings"), note) if w)
    return WorkerOutcome(result, exit_code, deadline_hit and result is None,
                         maxrss_kib * 1024 if maxrss_kib is not None else None, time.monotonic() - started,
                         log_path, started_by, ended_at=time.time())


def _wait(pid: int, event_fd: int, deadline: float, on_event, watch=None) -> tuple | str | None:
    """Forward events until the worker exits (its wait4 triple), the deadline passes (None) or the
    contention watch says stop (its evidence). Without pidfd support (or with a watch to tick), it
    wakes twice a second instead of waiting on the pipe and the pidfd alone (the module's docstring)."""
    selector = selectors.DefaultSelector()
    selector.register(event_fd, selectors.EVENT_READ, "events")
    try:
        pidfd = os.pidfd_open(pid)
        selector.register(pidfd, selectors.EVENT_READ, "exit")
    except (AttributeError, OSError):  # not Linux, or a kernel before 5.3
        pidfd = None
    buffer = [b""]
    try:
        while True:
            exited = os.wait4(pid, os.WNOHANG)
            if exited[0]:
                _drain(event_fd, buffer, on_event)
                return exited
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            for key, _ in selector.select(min(remaining, 0.5) if pidfd is None or watch else remaining):
                if key.data == "events" and not _read_events(event_fd, buffer, on_event):
                    selector.unregister(event_fd)  # EOF; the exit may still be pending
            evidence = watch.check() if watch is not None else ""
            if evidence:
                return evidence
    finally:
        selector.close()
        if pidfd is not None:
            os.close(pidfd)


def _read_events(fd: int, buffer: list, on_event) -> bool:
    chunk = os.read(fd, 65536)
    if not chunk:
        return False
    *lines, buffer[0] = (buffer[0] + chunk).split(b"\n")
    for line in lines:
        if on_event and line.strip():
            with contextlib.suppress(ValueError):
                on_event(json.loads(line))
    return True


def _drain(fd: int, buffer: list, on_event) -> None:
    """Read what the exited worker left in the pipe, without blocking on its grandchildren."""
    os.set_blocking(fd, False)
    with contextlib.suppress(BlockingIOError):
        while _read_events(fd, buffer, on_event):
            pass


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def processes_with_token(token: str) -> list[int]:
    """Live processes (of this user) whose environment carries the case token."""
    needle = f"AMP_BENCH_CASE_TOKEN={token}\0".encode()
    found = []
    for entry in os.scandir("/proc"):
        with contextlib.suppress(OSError):  # gone, another user's, or a zombie
            if entry.name.isdigit() and needle in Path(f"/proc/{entry.name}/environ").read_bytes() + b"\0":
                found.append(int(entry.name))
    return found


def _sweep(token: str, grace_s: float = 5.0) -> None:
    """SIGKILL every process the case left behind, in whatever session, until none is left (a
    rank's death-with-parent signal is delivered asynchronously, so look again briefly)."""
    if not os.path.isdir("/proc"):
        return
    deadline = time.monotonic() + grace_s
    while True:
        left = [pid for pid in processes_with_token(token) if pid != os.getpid()]
        if not left or time.monotonic() > deadline:
            return
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
