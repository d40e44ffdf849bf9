"""SLURM's word on a job, from the commands every cluster has: squeue (pending and running jobs, and
ended ones for MinJobAge, 300 s by default), then sacct (every ended job, where the cluster keeps
accounting), then scontrol. Parsed from their text; the command runner is a seam, so the parsing is
tested on recorded outputs.

Why not submitit's job.state: it asks sacct only, and sacct fails on clusters without accounting
(submitit then says UNKNOWN for every job).
"""
from __future__ import annotations

import contextlib
import getpass
import os
import re
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass

Runner = Callable[[list[str]], str | None]

QUEUED = ("PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "SUSPENDED")
ACTIVE = QUEUED + ("RUNNING", "COMPLETING", "STAGE_OUT", "SIGNALING", "RESIZING", "STOPPED")
# the row status of a case whose job ended (in this state) before it wrote the case's row
DIED_AS = {"CANCELLED": "cancelled", "TIMEOUT": "time_limit", "DEADLINE": "time_limit", "PREEMPTED": "preempted",
           "NODE_FAIL": "node_fail", "BOOT_FAIL": "node_fail"}


@dataclass(frozen=True)
class JobState:
    job_id: str
    state: str  # SLURM's (PENDING, RUNNING, COMPLETED, CANCELLED, TIMEOUT, ...), or UNKNOWN
    reason: str = ""
    node: str = ""
    source: str = ""  # the command that said so

    @property
    def queued(self) -> bool:
        return self.state in QUEUED

    @property
    def active(self) -> bool:
        return self.state in ACTIVE

    @property
    def died_status(self) -> str:
        """The status of a row its job never wrote: SLURM's reason for ending it, or `lost`."""
        return DIED_AS.get(self.state, "lost")

    def describe(self) -> str:
        where = f" on {self.node}" if self.node and self.node not in ("(null)", "None") else ""
        why = f" ({self.reason})" if self.reason and self.reason not in ("None", "(null)") else ""
        return f"SLURM job {self.job_id} {self.state}{why}{where}"


def run_command(command: list[str], timeout: float = 30) -> str | None:
    """stdout of a SLURM command, or None when it is missing or fails (no accounting: sacct fails)."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def _expand(job_id: str) -> list[str]:
    """'123_[0-2,5]' (a pending array's line) -> 123_0, 123_1, 123_2, 123_5; '123_4' -> itself."""
    match = re.fullmatch(r"(\d+)_\[([0-9,\-]+)(?:%\d+)?\]", job_id)
    if not match:
        return [job_id]
    out = []
    for part in match.group(2).split(","):
        lo, _, hi = part.partition("-")
        out += [f"{match.group(1)}_{i}" for i in range(int(lo), int(hi or lo) + 1)]
    return out


def parse_table(text: str, source: str) -> dict[str, JobState]:
    """Lines 'JOBID|STATE|REASON|NODES' (squeue -o '%i|%T|%r|%N', sacct -P -o JobID,State,Reason,NodeList)."""
    found = {}
    for line in (text or "").splitlines():
        fields = [f.strip() for f in line.split("|")]
        if len(fields) < 2 or not fields[0] or "." in fields[0]:
            continue  # a job step (123.batch), or not a job line
        state = fields[1].split()[0] if fields[1] else "UNKNOWN"  # sacct: "CANCELLED by 0"
        reason = fields[2] if len(fields) > 2 else ""
        node = fields[3] if len(fields) > 3 else ""
        for job_id in _expand(fields[0]):
            found[job_id] = JobState(job_id, state, reason, node, source)
    return found


def parse_scontrol(text: str, job_id: str) -> JobState | None:
    """`scontrol show job ID`: JobState=... Reason=... NodeList=..."""
    values = dict(re.findall(r"(\w+)=(\S*)", text or ""))
    if "JobState" not in values:
        return None
    return JobState(job_id, values["JobState"], values.get("Reason", ""), values.get("NodeList", ""), "scontrol")


def query(job_ids: list[str], runner: Runner = run_command) -> dict[str, JobState]:
    """Every job's state; UNKNOWN where no command knows it any more (ended long ago, no accounting)."""
    wanted = [str(j) for j in job_ids]
    if not wanted:
        return {}
    squeue = runner(["squeue", "--states=all", "-h", "-u", getpass.getuser(), "-o", "%i|%T|%r|%N"])
    found = {k: v for k, v in parse_table(squeue or "", "squeue").items() if k in wanted}
    missing = [j for j in wanted if j not in found]
    if missing:
        text = runner(["sacct", "-n", "-P", "-X", "-o", "JobID,State,Reason,NodeList", "-j", ",".join(missing)])
        found.update({k: v for k, v in parse_table(text or "", "sacct").items() if k in missing})
    for job_id in [j for j in wanted if j not in found]:
        state = parse_scontrol(runner(["scontrol", "show", "job", job_id]) or "", job_id)
        found[job_id] = state or JobState(job_id, "UNKNOWN", "SLURM no longer knows this job (it ended longer ago "
                                          "than MinJobAge, and there is no accounting to ask)", "", "")
    return found


def _process_running(pid: int) -> bool:
    with contextlib.suppress(ChildProcessError):  # not our child (a detached run's job): ask the kernel
        if os.waitpid(pid, os.WNOHANG)[0]:  # our own child, and it exited: reaped, no zombie left
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def query_local(job_ids: list[str]) -> dict[str, JobState]:
    """submitit's local executor: a job is its controller process (the job id is its pid)."""
    running = {job_id: job_id.isdigit() and _process_running(int(job_id)) for job_id in map(str, job_ids)}
    return {job_id: JobState(job_id, "RUNNING" if alive else "COMPLETED", "", "localhost", "local")
            for job_id, alive in running.items()}


def states(job_ids: list[str], cluster: str, runner: Runner = run_command) -> dict[str, JobState]:
    return query_local(job_ids) if cluster == "local" else query(job_ids, runner)


def cancel(job_ids: list[str], cluster: str, runner: Runner = run_command) -> None:
    """scancel (SLURM sends SIGTERM, then SIGKILL after KillWait: the jobs write their rows); on the local
    executor, SIGTERM to each job's controller, which passes it to the job."""
    ids = [str(j) for j in job_ids]
    if not ids:
        return
    if cluster == "local":
        for job_id in ids:
            with contextlib.suppress(ProcessLookupError, ValueError, PermissionError):
                os.kill(int(job_id), signal.SIGTERM)
        return
    runner(["scancel", *ids])
