"""The conductor of a lockstep set: one repeat's modes of one case group, measured by workers that are
alive together and take turns (measure/baton.py has the protocol).

Why: on a shared VM the machine's speed moves within seconds (steal bursts, a neighbour's job), so two
windows measured one after the other see different machines and their ratio, the speedup, scatters.
ResNet-50 bs 8 on a 2-core EPYC, eight pairs each way, interleaved: the pairs' log-ratio SD was 0.091
with the windows one after the other and 0.043 with the two workers alternating step by step (the
speedup 1.80x either way). Each member is still a process of its own (its own allocator, peak RSS,
flags and oneDNN caches); only their turns interleave.

The conductor is the parent's worker (`python -m amp_bench.worker lockstep`, a child of the fork server
like any case's worker). It forks one member per case (a copy of itself: torch imported, no op run, no
thread started, as the fork server's own children), then gives turns: each member's set-up and warmup,
one after another; the windows, round-robin, a turn at a time, until every member's window is over;
then each member's instrumented steps (FLOPs, the profile) and exit. A member that dies simply ends its
turns: the others go on. A member that holds its turns for longer than its case's timeout_s in all
(a hung step) is killed there, as a worker of its own would be at its deadline; its partners go on.
Each member writes its own result file and log; the conductor tells the parent at once of each member
that ends (a `member_end` event: pid, exit status, killed at its deadline), so a member that died early
keeps its own ending even if the set is stopped later; its result repeats them all with each one's
peak RSS (wait4 at the end, which only it can read).
"""
from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import time
import traceback

from amp_bench.measure.baton import BATON_ENV, GO, MORE, WINDOW_OVER
from amp_bench.measure.channel import EventChannel
from amp_bench.measure.ending import die_with_parent, exit_without_teardown


class _Member:
    def __init__(self, place: int, pid: int, go_fd: int, reply_fd: int, timeout_s: float | None):
        self.place, self.pid, self.go_fd, self.reply_fd = place, pid, go_fd, reply_fd
        self.timeout_s = timeout_s  # its case's timeout, spent on its own turns only
        self.held_s = 0.0
        self.timed_out = False  # killed at its deadline
        self.ending: dict | None = None  # once its turns ended: pid, exit code, timed_out, held_s

    def turn(self) -> bytes:
        """Give one turn; the member's answer (b'' once it has exited, or was killed at its deadline)."""
        if self.ending is not None:
            return b""
        started = time.monotonic()
        try:
            os.write(self.go_fd, GO)
            answer = self._answer(started)
        except OSError:  # it died: the pipe is broken
            answer = b""
        self.held_s += time.monotonic() - started
        return answer

    def _answer(self, started: float) -> bytes:
        if self.timeout_s is None:
            return os.read(self.reply_fd, 1)
        left = self.timeout_s - self.held_s - (time.monotonic() - started)
        ready, _, _ = select.select([self.reply_fd], [], [], max(left, 0.0))
        if ready:
            return os.read(self.reply_fd, 1)
        os.kill(self.pid, signal.SIGKILL)  # its turns outlasted its case's timeout: a hung step
        self.timed_out = True
        return b""

    def ended(self, events: EventChannel) -> None:
        """Once its turns have ended: tell the parent at once how it ended. Not reaped yet (waitid's
        WNOWAIT): until every window is over its partners still read its CPU time in /proc (a zombie's
        stays there), which counts on their side, not as another process's."""
        if self.ending is None:
            info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOWAIT)
            code = info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
            self.ending = {"pid": self.pid, "exit_code": code, "timed_out": self.timed_out,
                           "held_s": round(self.held_s, 3), "ended_at": time.time()}
            events.emit(event="member_end", member=self.place, **self.ending)

    def reap(self, events: EventChannel) -> dict:
        """Its ending with its peak RSS (wait4, which reaps it)."""
        for fd in (self.go_fd, self.reply_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.ended(events)
        _, _, usage = os.wait4(self.pid, 0)
        return {**self.ending, "maxrss_kib": usage.ru_maxrss}


def conduct(spec: dict, events: EventChannel, run_member) -> dict:
    """Run the set described by `spec` ({"members": [{spec, result, log, env, timeout_s}, ...]}); returns
    the conductor's record: each member's pid, exit code, peak RSS and whether it was killed at its
    deadline. `run_member(spec path, result path, events)` is what a member process runs (the worker's
    case job) and returns its exit code."""
    members = _fork_members(spec["members"], run_member)
    header = (" ".join(str(m.pid) for m in members) + "\n").encode()
    for member in members:
        with contextlib.suppress(OSError):
            os.write(member.go_fd, header)
    windows = [m for m in members if _turn(m, events) == MORE]  # set-up and warmup, one after another
    over = []
    while windows:  # the windows, a turn each in the set's order
        for member in list(windows):
            answer = _turn(member, events)
            if answer != MORE:
                windows.remove(member)
                if answer == WINDOW_OVER:
                    over.append(member)
    events.emit(event="phase", phase="after")  # every window is over: the parent's contention watch ends
    for member in over:  # instrumentation, one after another: the member exits at the end of its turn
        while _turn(member, events):
            pass
    return {"status": "ok", "reason": "", "members": [m.reap(events) for m in members]}


def _turn(member: _Member, events: EventChannel) -> bytes:
    """One turn; the parent hears at once of a member whose turns have ended."""
    answer = member.turn()
    if not answer:
        member.ended(events)
    return answer


def _fork_members(specs: list[dict], run_member) -> list[_Member]:
    members, child_fds = [], []
    event_fd = int(os.environ["AMP_BENCH_EVENT_FD"]) if os.environ.get("AMP_BENCH_EVENT_FD") else None
    conductor = os.getpid()  # read before the fork: a member's getppid() is init once the conductor dies
    for place, member_spec in enumerate(specs):
        go_read, go_write = os.pipe()
        reply_read, reply_write = os.pipe()
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        pid = os.fork()
        if pid == 0:
            for fd in [go_write, reply_read, *child_fds]:
                os.close(fd)
            _member(place, member_spec, (go_read, reply_write), event_fd, conductor, run_member)
        os.close(go_read)
        os.close(reply_write)
        child_fds += [go_write, reply_read]
        members.append(_Member(place, pid, go_write, reply_read, member_spec.get("timeout_s")))
    return members


def _member(place: int, spec: dict, baton_fds: tuple[int, int], event_fd: int | None, conductor: int,
            run_member) -> None:
    """In the forked member: its own log and environment, then one case job."""
    code = 1
    try:
        log_fd = os.open(spec["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(log_fd)
        os.environ.update(spec.get("env") or {})
        os.environ[BATON_ENV] = f"{baton_fds[0]},{baton_fds[1]}"
        os.environ["AMP_BENCH_PARENT_PID"] = str(conductor)
        die_with_parent()  # a conductor killed at its deadline takes its members with it
        events = EventChannel(os.dup(event_fd) if event_fd is not None else None, member=place)
        code = run_member(spec["spec"], spec["result"], events)
    except BaseException:  # as a worker would: the traceback in its log, exit 1
        traceback.print_exc()
    exit_without_teardown(code)
