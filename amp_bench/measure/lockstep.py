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
turns: the others go on. Each member writes its own result file and log; the conductor's result is
each member's pid, exit status and peak RSS (wait4), which only it can read.
"""
from __future__ import annotations

import os
import sys
import traceback

from amp_bench.measure.baton import BATON_ENV, GO, MORE, WINDOW_OVER
from amp_bench.measure.channel import EventChannel, die_with_parent, exit_without_teardown


class _Member:
    def __init__(self, pid: int, go_fd: int, reply_fd: int):
        self.pid, self.go_fd, self.reply_fd = pid, go_fd, reply_fd

    def turn(self) -> bytes:
        """Give one turn; the member's answer (b'' once it has exited)."""
        try:
            os.write(self.go_fd, GO)
            return os.read(self.reply_fd, 1)
        except OSError:  # it died: the pipe is broken
            return b""


def conduct(spec: dict, events: EventChannel, run_member) -> dict:
    """Run the set described by `spec` ({"members": [{spec, result, log, env}, ...]}); returns the
    conductor's record: each member's pid, exit code and peak RSS. `run_member(spec path, result path,
    events)` is what a member process runs (the worker's case job) and returns its exit code."""
    members = _fork_members(spec["members"], run_member)
    header = (" ".join(str(m.pid) for m in members) + "\n").encode()
    for member in members:
        try:
            os.write(member.go_fd, header)
        except OSError:
            pass
    windows = [m for m in members if m.turn() == MORE]  # set-up and warmup, one after another
    over = []
    while windows:  # the windows, a turn each in the set's order
        for member in list(windows):
            answer = member.turn()
            if answer != MORE:
                windows.remove(member)
                if answer == WINDOW_OVER:
                    over.append(member)
    events.emit(event="phase", phase="after")  # every window is over: the parent's contention watch ends
    for member in over:  # instrumentation, one after another: the member exits at the end of its turn
        while member.turn():
            pass
    return {"status": "ok", "reason": "", "members": [_reap(m) for m in members]}


def _fork_members(specs: list[dict], run_member) -> list[_Member]:
    members, child_fds = [], []
    event_fd = int(os.environ["AMP_BENCH_EVENT_FD"]) if os.environ.get("AMP_BENCH_EVENT_FD") else None
    for place, member_spec in enumerate(specs):
        go_read, go_write = os.pipe()
        reply_read, reply_write = os.pipe()
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        pid = os.fork()
        if pid == 0:
            for fd in [go_write, reply_read, *child_fds]:
                os.close(fd)
            _member(place, member_spec, go_read, reply_write, event_fd, run_member)
        os.close(go_read)
        os.close(reply_write)
        child_fds += [go_write, reply_read]
        members.append(_Member(pid, go_write, reply_read))
    return members


def _member(place: int, spec: dict, go_fd: int, reply_fd: int, event_fd: int | None, run_member) -> None:
    """In the forked member: its own log and environment, then one case job."""
    code = 1
    try:
        log_fd = os.open(spec["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(log_fd)
        os.environ.update(spec.get("env") or {})
        os.environ[BATON_ENV] = f"{go_fd},{reply_fd}"
        os.environ["AMP_BENCH_PARENT_PID"] = str(os.getppid())
        die_with_parent()  # a conductor killed at its deadline takes its members with it
        events = EventChannel(os.dup(event_fd) if event_fd is not None else None, member=place)
        code = run_member(spec["spec"], spec["result"], events)
    except BaseException:  # noqa: BLE001 - as a worker would: the traceback in its log, exit 1
        traceback.print_exc()
    exit_without_teardown(code)


def _reap(member: _Member) -> dict:
    for fd in (member.go_fd, member.reply_fd):
        try:
            os.close(fd)
        except OSError:
            pass
    _, status, usage = os.wait4(member.pid, 0)
    return {"pid": member.pid, "exit_code": os.waitstatus_to_exitcode(status), "maxrss_kib": usage.ru_maxrss}
