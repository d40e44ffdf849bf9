"""Did the case get its machine? What the measured window really received, read at its edges.

CPU: the CPU time every other process on the host used during the window (host busy time from
/proc/stat minus this worker's own), steal time (a VM's hypervisor giving the core away) and the
load average. From them, the share of its threads' cores the worker could have had. Steady
contention does not raise the step-time CV (every step is slow alike), so a CV warning can't be the
guard: a busy neighbour turns a 1.6 ms step into 390 ms with a CV of 1.5%.
GPU: other processes on the device, and clocks held down (thermal, power brake, hardware slowdown)
inside the window.

/proc/stat counts in clock ticks (USER_HZ, 10 ms): over a span of `span_s`, the cores other
processes used are known to about 2 ticks per CPU, 2 * cpus / (ticks_per_s * span_s) cores. A span
is judged only when that error is at most a third of the tolerance (the cores others may use before
the row is flagged). A window too short is widened to warmup + window (eager cases: the warmup
reading is taken before the first warmup step); if that is still too short, contention is unknown
(`contended` empty, the reason in `contention`): neither contended nor trusted-quiet, and comparable.

/proc is read through paths that tests point at files replaying real readings.
"""
from __future__ import annotations

import contextlib
import os
import resource
import time
from dataclasses import dataclass
from pathlib import Path

# A case that could use less than this share of its threads' cores is `contended`.
MIN_CPU_SHARE = 0.85
MAX_STEAL = 0.05  # share of the host's CPU time stolen by the hypervisor
TICK_ERROR = 2  # /proc/stat's error over a span, in ticks per CPU (one at each edge)
RESOLUTION = 3  # judge a span only when that error is at most a third of the tolerance
MIN_TOLERANCE_CORES = 0.05  # the tolerance's floor (threads are capped at the host's CPUs: never reached)
# Clock-event reasons that mean someone else (heat, power, the board) held the clocks down.
THROTTLE_REASONS = ("hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")

# Off only where the step times are synthetic (a test model that drives a fake clock): the host's load
# then says nothing about the figures.
ENABLED = True

CONTENTION_COLUMNS = ["contended", "contention", "cpu_share_available", "host_other_cpu_cores",
                      "steal_fraction", "loadavg_1m", "gpu_other_processes"]


@dataclass(frozen=True)
class HostTimes:
    busy_s: float  # every CPU's non-idle time since boot, steal excluded
    steal_s: float
    own_cpu_s: float  # this process's user + system time (all its threads)
    cpus: int  # the CPUs /proc/stat adds up (the host's, also inside a container)


def _clock_ticks() -> int:
    with contextlib.suppress(ValueError, OSError, AttributeError):
        return os.sysconf("SC_CLK_TCK")
    return 100


_ALL_CPUS = "cpu"  # /proc/stat's first line: every CPU together


def read_host_times(stat_path: str = "/proc/stat", own_cpu_s: float | None = None) -> HostTimes | None:
    """None where /proc/stat can't be read (not Linux): contention is then unknown, never assumed."""
    try:
        lines = Path(stat_path).read_text(encoding="ascii").splitlines()
    except OSError:
        return None
    fields = lines[0].split() if lines else []
    cpus = sum(1 for line in lines if line.startswith("cpu") and line[3:4].isdigit()) or 1
    if not fields or fields[0] != _ALL_CPUS:
        return None
    # user nice system idle iowait irq softirq steal guest guest_nice (guest is inside user)
    values = [int(v) for v in fields[1:]] + [0] * 10
    user, nice, system, _idle, _iowait, irq, softirq, steal = values[:8]
    tick = _clock_ticks()
    if own_cpu_s is None:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        own_cpu_s = usage.ru_utime + usage.ru_stime
    return HostTimes((user + nice + system + irq + softirq) / tick, steal / tick, own_cpu_s, cpus)


def parse_proc_stat(text: str) -> tuple[int, float, str]:
    """(ppid, user + system time in seconds with its reaped children's, comm) from /proc/PID/stat."""
    name, _, rest = text[text.index("(") + 1:].rpartition(")")
    fields = rest.split()  # after the name: state ppid ... utime(11) stime(12) cutime(13) cstime(14), from state
    return int(fields[1]), sum(int(f) for f in fields[11:15]) / _clock_ticks(), name


def process_cpu_s(pid: int, proc: str = "/proc") -> float:
    """A process's CPU seconds so far. A lockstep member that ended stays a zombie, its time readable,
    until every window is over (measure/conductor.py); 0 once it is gone."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        return parse_proc_stat(Path(proc, str(pid), "stat").read_text(encoding="ascii", errors="replace"))[1]
    return 0.0


def read_loadavg(path: str = "/proc/loadavg") -> float | None:
    with contextlib.suppress(OSError, ValueError, IndexError):
        return float(Path(path).read_text(encoding="ascii").split()[0])
    return None


def resolvable_s(cpus: int, threads: int, ticks_per_s: float | None = None) -> float:
    """The shortest span whose "other processes' cores" error, TICK_ERROR * cpus / (ticks_per_s *
    span), is at most 1/RESOLUTION of the tolerance, cpus - MIN_CPU_SHARE * threads."""
    threads = max(1, min(threads, cpus))
    tolerance = max(MIN_TOLERANCE_CORES, cpus - MIN_CPU_SHARE * threads)
    return RESOLUTION * TICK_ERROR * cpus / ((ticks_per_s or _clock_ticks()) * tolerance)


def _duration(seconds: float) -> str:
    return f"{seconds * 1e3:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


def cpu_contention(before: HostTimes | None, after: HostTimes | None, window_s: float, threads: int,
                   loadavg: float | None = None, ticks_per_s: float | None = None, span: str = "window") -> dict:
    """Columns for the window (or the `span` the readings cover). `cpu_share_available`: the share of
    its `threads` cores the worker could have had, once the cores other processes used are taken
    away (1.0: all of them). A span shorter than /proc/stat can resolve (resolvable_s) keeps the
    figures but is not judged: `contended` None, `contention` "unknown (...)"."""
    out = {c: None for c in CONTENTION_COLUMNS}
    out.update(loadavg_1m=loadavg, contended=None, contention="")
    if before is None or after is None or window_s <= 0:
        out["contention"] = "unknown (no /proc/stat)"
        return out
    cpus = after.cpus
    others_s = max(0.0, (after.busy_s - before.busy_s) - (after.own_cpu_s - before.own_cpu_s))
    others_cores = others_s / window_s
    steal = max(0.0, after.steal_s - before.steal_s) / (window_s * cpus)
    threads = max(1, min(threads, cpus))
    share = max(0.0, min(1.0, (cpus - others_cores) / threads))
    out.update(cpu_share_available=share, host_other_cpu_cores=others_cores, steal_fraction=steal)
    needed = resolvable_s(cpus, threads, ticks_per_s)
    if window_s < needed:
        out["contention"] = (f"unknown ({span} {_duration(window_s)} is shorter than /proc/stat can resolve: "
                             f"needs {needed:.2f} s)")
        return out
    during = "the window" if span == "window" else f"{span} ({window_s:.2f} s)"
    reasons = []
    if share < MIN_CPU_SHARE:
        reasons.append(f"other processes used {others_cores:.2f} of {cpus} cores during {during}: the worker's "
                       f"{threads} thread(s) could have had {share:.0%} of their cores")
    if steal > MAX_STEAL:
        reasons.append(f"the hypervisor stole {steal:.0%} of the CPU time")
    out["contended"] = bool(reasons)
    out["contention"] = "; ".join(reasons)
    return out


def gpu_contention(other_pids: list[int] | None, clock_event_reasons: str | None) -> dict:
    """Columns for a GPU window: other processes on the device, or clocks held down in the window."""
    reasons = []
    if other_pids:
        reasons.append(f"{len(other_pids)} other process(es) on the GPU (pid {', '.join(map(str, other_pids[:5]))})")
    held = [r for r in str(clock_event_reasons or "").replace(",", " ").split() if r in THROTTLE_REASONS]
    if held:
        reasons.append(f"clocks held down in the window ({', '.join(held)})")
    return {"gpu_other_processes": len(other_pids) if other_pids is not None else None,
            "contended": bool(reasons), "contention": "; ".join(reasons)}


def merge(cpu: dict, gpu: dict | None) -> dict:
    """One set of columns: contended when either side was."""
    if not gpu:
        return cpu
    out = dict(cpu)
    out["gpu_other_processes"] = gpu["gpu_other_processes"]
    flagged = bool(cpu.get("contended")) or gpu["contended"]
    # a quiet GPU does not make an unknown CPU side quiet: still unknown, with its reason
    out["contended"] = True if flagged else (None if cpu.get("contended") is None else False)
    reasons = [r for r in (cpu.get("contention"), gpu["contention"]) if r and not r.startswith("unknown")]
    out["contention"] = "; ".join(reasons) if flagged or reasons else (cpu.get("contention") or "")
    return out


class WindowWatch:
    """Read the host at the window's edges: start() before the first measured step, stop() after;
    mark_warmup() before the first warmup step widens a window too short to judge (eager cases only:
    inductor's compile workers are other processes)."""

    def __init__(self, threads: int, stat_path: str = "/proc/stat", loadavg_path: str = "/proc/loadavg",
                 clock=time.monotonic, read=None, ticks_per_s: float | None = None, partners=(),
                 proc_path: str = "/proc"):
        self.threads = threads
        self.stat_path, self.loadavg_path, self.clock = stat_path, loadavg_path, clock
        # a lockstep member's partners (measure/baton.py) take turns with it: their CPU time is its side's
        self.partners, self.proc_path = tuple(partners), proc_path
        self.read = read or (lambda: read_host_times(self.stat_path, self._own_cpu_s()))  # tests replay readings
        self.ticks_per_s = ticks_per_s
        self._before: HostTimes | None = None
        self._started = 0.0
        self._warmup: tuple[HostTimes | None, float] | None = None

    def _own_cpu_s(self) -> float | None:
        if not self.partners:
            return None  # read_host_times takes this process's own
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime + sum(process_cpu_s(pid, self.proc_path) for pid in self.partners)

    def mark_warmup(self) -> None:
        self._warmup = (self.read(), self.clock())

    def start(self) -> None:
        self._before = self.read()
        self._started = self.clock()

    def stop(self) -> dict:
        """Columns for the window just ended (its real length, whatever clock timed the steps), or for
        warmup + window when the window alone is too short for /proc/stat and that span is not."""
        if not ENABLED:
            return {**cpu_contention(None, None, 0.0, self.threads), "contention": "not checked (synthetic step times)"}
        after, now, loadavg = self.read(), self.clock(), read_loadavg(self.loadavg_path)
        window = cpu_contention(self._before, after, now - self._started, self.threads, loadavg, self.ticks_per_s)
        if window["contended"] is not None or self._warmup is None or None in (self._warmup[0], self._before, after):
            return window
        wider = cpu_contention(self._warmup[0], after, now - self._warmup[1], self.threads, loadavg,
                               self.ticks_per_s, span="warmup + window")
        if wider["contended"] is not None:
            return wider
        window["contention"] = window["contention"][:-1] + f"; warmup + window {_duration(now - self._warmup[1])} too)"
        return window
