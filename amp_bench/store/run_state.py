"""Is a run still going? Heartbeats, and the one reading of a run's state that `status`, `report`,
`nightly` and `run --resume` share.

A run's manifest says `running` from its start until its parent writes `complete` or `interrupted`.
A parent killed outright (SIGKILL, a lost node) never writes either, so every process that runs a
run's cases (the local parent; each SLURM job) keeps a heartbeat file in heartbeats/: who it is
(host, boot id, pid and the pid's start time, so a reused pid is not taken for it), what it is doing,
and when it last said so (every HEARTBEAT_S). On its own host, a process is alive or gone for certain
(/proc); from another host (a login node reading a compute node's run on a shared filesystem), a
heartbeat older than STALE_S means gone. Torch-free.

Why by hand: a pid file says nothing once the pid is reused, and SLURM knows nothing of a local run;
no library keeps this record for a directory of results.
"""
from __future__ import annotations

import contextlib
import csv
import datetime as dt
import json
import os
import socket
import threading
from dataclasses import dataclass, field
from pathlib import Path

HEARTBEAT_DIR = "heartbeats"
HEARTBEAT_S = 10.0
STALE_S = 60.0  # six beats missed: the writer is gone
# Statuses a row gets when its case did not finish because its job or parent ended (SLURM ended the
# job, the parent cancelled it), not because of the case: `run --resume` runs these again, as it runs
# cases without a row. Every other status (ok, oom, error, timeout, ...) is the case's own outcome.
DIED_STATUSES = ("cancelled", "time_limit", "preempted", "node_fail", "lost")
# rows `run --resume` runs again: a died job's, and a case stopped because the machine was busy
RERUN_STATUSES = DIED_STATUSES + ("contended",)
STATES = ("complete", "running", "queued", "interrupted", "unknown")


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def _boot_id() -> str:
    with contextlib.suppress(OSError):
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    return ""


def _start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22); None if it is gone,
    or dead and not yet reaped (a zombie: a killed parent whose own parent never waits, as under a
    container's init)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # the fields after the command name: state is field 3
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])  # field 22


def identity(pid: int | None = None) -> dict:
    """This process as a heartbeat names it."""
    pid = pid or os.getpid()
    return {"host": socket.gethostname(), "boot_id": _boot_id(), "pid": pid, "pid_start": _start_ticks(pid)}


def alive(beat: dict, host: str | None = None, boot_id: str | None = None) -> bool | None:
    """True or False when the beat's process is on this host (and this boot); None when it is elsewhere."""
    if beat.get("host") != (host or socket.gethostname()) or beat.get("boot_id") != (boot_id or _boot_id()):
        return None
    start = _start_ticks(int(beat.get("pid") or 0)) if beat.get("pid") else None
    return start is not None and start == beat.get("pid_start")


class Heartbeat:
    """heartbeats/NAME.json, rewritten every HEARTBEAT_S by a daemon thread while the block runs, and a
    last time with `ended_at` and the outcome when it ends. set(**fields) changes what it says (the case
    now running) and writes at once."""

    def __init__(self, run_dir: str | os.PathLike, name: str, interval_s: float = HEARTBEAT_S, **fields):
        self.path = Path(run_dir) / HEARTBEAT_DIR / f"{name}.json"
        self.interval_s = interval_s
        self.fields = {"name": name, **identity(), "started_at": _now().isoformat(), **fields}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def _write(self) -> None:
        with self._lock:
            data = {**self.fields, "at": _now().isoformat()}
            tmp = self.path.with_name(f".{self.path.name}.tmp{os.getpid()}")
            # a full or read-only disk must not stop the measurement; staleness tells later
            with contextlib.suppress(OSError):
                tmp.write_text(json.dumps(data, default=str), encoding="utf-8")
                os.replace(tmp, self.path)

    def set(self, **fields) -> None:
        self.fields.update(fields)
        self._write()

    def _beat(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._write()

    def __enter__(self) -> Heartbeat:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._write()
        self._thread = threading.Thread(target=self._beat, name="amp_bench-heartbeat", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        outcome = self.fields.get("outcome") or ("finished" if exc_type is None else f"stopped ({exc_type.__name__})")
        self.set(ended_at=_now().isoformat(), outcome=outcome)


def read_heartbeats(run_dir: str | os.PathLike) -> list[dict]:
    folder = Path(run_dir) / HEARTBEAT_DIR
    beats = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        with contextlib.suppress(OSError, ValueError):  # being replaced this instant, or damaged: the others tell
            beats.append(json.loads(path.read_text(encoding="utf-8")))
    return beats


def live_beats(run_dir: str | os.PathLike, now: dt.datetime | None = None) -> list[dict]:
    """The heartbeats of the processes still running cases in a run."""
    now = now or _now()
    return [b for b in read_heartbeats(run_dir) if _live(b, now)]


def _live(beat: dict, now: dt.datetime) -> bool:
    """Not ended, and alive on this host, or elsewhere and younger than STALE_S."""
    return not beat.get("ended_at") and (alive(beat) is True or (alive(beat) is None and _age_s(beat, now) <= STALE_S))


def _age_s(beat: dict, now: dt.datetime) -> float:
    with contextlib.suppress(KeyError, TypeError, ValueError):
        return (now - dt.datetime.fromisoformat(beat["at"])).total_seconds()
    return float("inf")


@dataclass
class RunState:
    state: str  # one of STATES
    detail: str
    cases_done: int = 0
    cases_planned: int | None = None
    live: list[dict] = field(default_factory=list)  # heartbeats of the processes running it now
    waiting_jobs: list[str] = field(default_factory=list)  # SLURM jobs submitted that never reported

    @property
    def finished(self) -> bool:
        return self.state in ("complete", "interrupted")


def row_statuses(run_dir: Path) -> list[str]:
    """The `status` of every row in results.csv (the csv module: no pandas for a glance at a run)."""
    path = Path(run_dir) / "results.csv"
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            return [row.get("status") or "" for row in csv.DictReader(fh)]
    except (OSError, csv.Error, UnicodeDecodeError):
        return []


def run_state(run_dir: str | os.PathLike, manifest: dict | None = None, now: dt.datetime | None = None) -> RunState:
    """What the files say of a run: complete, running (a live heartbeat), queued (SLURM jobs submitted,
    none started), interrupted (its writers are gone with cases left), or unknown (a run written
    before heartbeats, still marked running). SLURM's own view of queued jobs is the executor's
    (`amp_bench status` asks it); this reads files only."""
    from amp_bench.store.results import read_manifest
    run_dir = Path(run_dir)
    manifest = manifest if manifest is not None else (read_manifest(run_dir) or {})
    now = now or _now()
    planned = manifest.get("cases_planned")
    done = sum(1 for x in row_statuses(run_dir) if x not in DIED_STATUSES)  # died rows are cases still to run
    status = manifest.get("status", "")

    def state(name: str, detail: str, **more) -> RunState:
        return RunState(name, detail, done, planned, **more)

    if status == "complete":
        return state("complete", manifest.get("finished_at", ""))
    if status == "interrupted":
        return state("interrupted", manifest.get("interrupted_reason") or "stopped (Ctrl-C or SIGTERM) before every "
                     "case ran")
    beats = read_heartbeats(run_dir)
    running = [b for b in beats if not b.get("ended_at")]
    live = [b for b in running if _live(b, now)]
    if live:
        return state("running", "; ".join(f"{b.get('case') or 'starting'} on {b.get('host')}" for b in live), live=live)
    executor = (manifest.get("executor") or {}).get("type", "local")
    jobs = [str(j) for j in (manifest.get("jobs") or {})]
    reported = {str(b.get("job_id")) for b in beats if b.get("job_id")}
    waiting = [j for j in jobs if j not in reported]
    if planned is not None and done >= planned and not waiting:
        return state("complete", "every planned case has a row (its last writer did not mark the run complete)")
    if executor == "slurm" and waiting:
        return state("queued", f"{len(waiting)} SLURM job(s) not started: {', '.join(waiting[:5])}",
                     waiting_jobs=waiting)
    if not beats:
        return state("unknown", "marked running, with no heartbeat (written before amp_bench kept one)")
    gone = running[0] if running else beats[-1]
    if gone.get("ended_at"):
        why = f"its last writer ({gone.get('name')}) ended {gone.get('outcome', '')} at {gone['ended_at']}"
    elif alive(gone) is False:
        why = f"its writer (pid {gone.get('pid')} on {gone.get('host')}) is gone: killed, or its node lost"
    else:
        why = f"no heartbeat from {gone.get('host')} since {gone.get('at')}"
    return state("interrupted", f"{why}; {done} of {planned if planned is not None else '?'} cases have a row")
