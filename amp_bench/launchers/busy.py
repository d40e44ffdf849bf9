"""Contention that ends a case early: the parent watches the host while a worker runs and stops the case
as `contended`, with its evidence, once other processes have held the worker well under its share of
the cores for long enough to be sure.

Beside three busy processes on 2 cores, a ResNet-18 step that takes 40 ms on a quiet machine did not
finish 20 steps in 120 s: every case of the smoke suite timed out, two minutes each, with no word about
the machine (OpenMP threads that spin at barriers make one busy neighbour cost 10-100x). A case measured
that way is not a measurement, so waiting for its timeout buys nothing.

The rule. Every TICK_S the parent reads /proc/stat (the host's busy and steal time) and /proc/*/stat
(each process's CPU time and parent): "ours" is the worker and everything under it (a fork server's
child, torchrun's ranks, inductor's compile workers), the rest is "others". Over each one-second span,
the worker could have had (cpus - others' cores - stolen cores) / needed of the cores it needs (its
torch threads on a CPU, one host core per GPU rank). The case is stopped when every one-second span
of the last HOLD_S seconds was below MIN_CPU_SHARE (the threshold the window-edge check uses, 0.85):
- one-second spans: /proc/stat's error is about 2 ticks per CPU per span (0.04 cores on 2 CPUs at 100
  ticks/s), a seventh of the 0.3-core tolerance a 2-thread worker has on 2 cores, so a span is judged
  reliably on its own;
- HOLD_S = 3 s: a burst (a cron job, a compile, a `pip` in another shell) shorter than that passes,
  and is still flagged at the window's edges if it overlapped it; contention that lasts 3 s is the
  steady kind that distorts a whole window. Stopping costs at most 3 s more than the case's start.
The watch ends when the worker says its measured window is over: instrumentation after it (FLOPs,
the explain profile) is not the measurement. Written here because no library watches a process tree's
share of a host; the /proc parsing is measure.telemetry.contention's.
"""
from __future__ import annotations

import contextlib
import os
import time
from collections import Counter, deque
from dataclasses import dataclass
from pathlib import Path

from amp_bench.measure.telemetry.contention import MIN_CPU_SHARE, parse_proc_stat, read_host_times

TICK_S = 0.5
SPAN_S = 1.0
HOLD_S = 3.0
SUMMARY_MIN_S = 0.5  # the shortest worker life judged as a whole (tick error 0.08 cores on 2 CPUs, a quarter
#                      of a 2-thread worker's 0.3-core tolerance)


@dataclass(frozen=True)
class Snapshot:
    at: float  # monotonic seconds
    busy_s: float  # the host's non-idle CPU time, steal excluded
    steal_s: float
    cpus: int
    processes: dict  # pid -> (ppid, cpu seconds incl. reaped children, name)


def read_processes(proc: Path = Path("/proc")) -> dict:
    """pid -> (ppid, utime + stime + cutime + cstime in seconds, comm) for every process readable."""
    found = {}
    for entry in os.scandir(proc):
        with contextlib.suppress(OSError, IndexError, ValueError):  # gone, or not a stat line
            if entry.name.isdigit():
                stat = Path(f"{entry.path}/stat").read_text(encoding="ascii", errors="replace")
                found[int(entry.name)] = parse_proc_stat(stat)
    return found


def snapshot(clock=time.monotonic) -> Snapshot | None:
    host = read_host_times(own_cpu_s=0.0)
    if host is None:
        return None
    return Snapshot(clock(), host.busy_s, host.steal_s, host.cpus, read_processes())


def tree(processes: dict, root: int) -> set[int]:
    """root and every process under it, by parent links."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in processes.items():
        children.setdefault(ppid, []).append(pid)
    ours, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in ours:
            ours.add(pid)
            todo.extend(children.get(pid, ()))
    return ours


class ContentionWatch:
    """Ticked by the parent's wait loop; `check()` returns the evidence once the case must stop."""

    def __init__(self, root_pid: int, needed: int, read=snapshot, clock=time.monotonic):
        self.root, self.needed = root_pid, max(1, needed)
        self.read, self.clock = read, clock
        self.history: deque[Snapshot] = deque(maxlen=int(4 * HOLD_S / TICK_S) + 4)
        self.next_tick = 0.0
        self.done = False  # the measured window is over: nothing left to protect

    def on_event(self, event: dict) -> None:
        # a lockstep member's own events carry its place ("member"): the windows are over when the
        # conductor says so, after every member's (measure/conductor.py)
        if event.get("event") == "phase" and event.get("phase") == "after" and not self.done and "member" not in event:
            taken = self.read()  # the window's end closes the span a short worker is judged over (lifetime())
            if taken is not None:
                self.history.append(taken)
            self.done = True

    def lifetime(self) -> str:
        """After the worker ended without being stopped: the evidence when, over the whole span the watch
        saw it (SUMMARY_MIN_S at least), others held it under MIN_CPU_SHARE ('' otherwise). A case too
        short for the window's own /proc/stat check (a few 10 ms steps) is judged on its worker's life."""
        if len(self.history) < 2 or self.history[-1].at - self.history[0].at < SUMMARY_MIN_S:
            return ""
        first, last = self.history[0], self.history[-1]
        ours = tree(last.processes, self.root)
        if self.share(first, last, ours)[0] >= MIN_CPU_SHARE:
            return ""
        return self.evidence(first, last, ours, ending=" over the worker's life")

    def check(self) -> str:
        """Take a reading when one is due (the first at once); the evidence ('' while the case may go on)."""
        now = self.clock()
        if self.done or now < self.next_tick:
            return ""
        self.next_tick = now + TICK_S
        taken = self.read()
        if taken is None:  # no /proc: contention is never decided here (the window-edge check says unknown)
            self.done = True
            return ""
        self.history.append(taken)
        return self.verdict()

    def _ours_cpu(self, snap: Snapshot, ours: set[int]) -> float:
        return sum(cpu for pid, (_, cpu, _) in snap.processes.items() if pid in ours)

    def share(self, start: Snapshot, end: Snapshot, ours: set[int]) -> tuple[float, float]:
        """(the share of its needed cores the worker could have had, others' cores) between two readings."""
        span = end.at - start.at
        mine = max(0.0, self._ours_cpu(end, ours) - self._ours_cpu(start, ours))
        others = max(0.0, (end.busy_s - start.busy_s) - mine) / span
        stolen = max(0.0, end.steal_s - start.steal_s) / span
        return max(0.0, min(1.0, (end.cpus - others - stolen) / min(self.needed, end.cpus))), others

    def verdict(self) -> str:
        """The evidence when each of the last HOLD_S seconds' one-second spans was contended, else ''."""
        latest = self.history[-1]
        if latest.at - self.history[0].at < HOLD_S - 1e-9:
            return ""
        ours = tree(latest.processes, self.root)
        shares = []
        for k in range(round(HOLD_S / SPAN_S)):
            end, start = self._at(latest.at - k * SPAN_S), self._at(latest.at - (k + 1) * SPAN_S)
            if start is None or end is None or end.at - start.at < SPAN_S / 2:
                return ""
            shares.append(self.share(start, end, ours)[0])
        if max(shares) >= MIN_CPU_SHARE:
            return ""
        return self.evidence(self._at(latest.at - HOLD_S) or self.history[0], latest, ours)

    def _at(self, when: float) -> Snapshot | None:
        """The latest reading taken at or before `when`."""
        found = [s for s in self.history if s.at <= when + 1e-9]
        return found[-1] if found else None

    def evidence(self, start: Snapshot, end: Snapshot, ours: set[int],
                 ending: str = "; stopped early as contended") -> str:
        """'3 other processes (python3 x3) used 1.93 of 2 cores for 3.0 s: ...' from the two readings."""
        share, others = self.share(start, end, ours)
        span = end.at - start.at
        def used(pid: int, cpu: float) -> float:  # a process started within the span: all of its time
            return (cpu - (start.processes[pid][1] if pid in start.processes else 0.0)) / span
        busy = sorted((used(pid, cpu), name) for pid, (_, cpu, name) in end.processes.items()
                      if pid not in ours and used(pid, cpu) >= 0.05)
        names = Counter(name for _, name in busy)
        who = f"{len(busy)} other process{'es' if len(busy) != 1 else ''}"
        if names:
            who += " (" + ", ".join(f"{n} x{k}" if k > 1 else n for n, k in names.items()) + ")"
        return (f"{who} used {others:.2f} of {end.cpus} cores for {span:.1f} s: the worker's {self.needed} "
                f"thread(s) could have had {share:.0%} of their cores{ending}")


def cores_needed(device_type: str, threads: int | None, processes: int = 1) -> int:
    """What a case needs of the host: its torch threads on a CPU (all ranks together), one host core a
    GPU rank (the step launches kernels and waits)."""
    if device_type == "cpu":
        return max(1, (threads or len(os.sched_getaffinity(0))) * processes)
    return max(1, processes)


def quiet_now(needed: int, seconds: float = 2.0, read=snapshot, sleep=time.sleep) -> tuple[bool, str]:
    """Is the machine quiet enough to run a case again (what others use leaves `needed` cores their
    share)? With what others used, for the note."""
    first = read()
    sleep(seconds)
    second = read()
    if first is None or second is None:
        return True, "no /proc/stat to tell"
    share, others = ContentionWatch(-1, needed).share(first, second, set())
    return share >= MIN_CPU_SHARE, f"other processes used {others:.2f} of {second.cpus} cores"
