"""Inside a job: which SLURM job this is (or which job of submitit's local executor), and the signals
that end it, turned into one stop request with SLURM's reason.

SLURM ends a job by signalling it and, KillWait seconds later (30 by default), killing it: SIGTERM
for scancel, for the time limit and for preemption; submitit asks for SIGUSR2 90 s before the time
limit as well. submitit's own handlers ignore SIGTERM and requeue on USR2, which suits checkpointed
training, not a benchmark: StopSignals takes both for the duration of the job, so its cases stop
cleanly and their rows say why (status cancelled, time_limit or preempted, with SLURM's reason).
"""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from dataclasses import asdict, dataclass

from amp_bench.executors.job_states import Runner, parse_scontrol, run_command


@dataclass(frozen=True)
class JobIdentity:
    cluster: str  # slurm | local (submitit's local executor)
    job_id: str  # as submitit names it: ARRAYJOB_TASK for an array task
    array_job_id: str = ""
    array_task_id: str = ""
    partition: str = ""
    node: str = ""
    gpus: str = ""  # SLURM_JOB_GPUS: the node's GPU indices the job was given (two jobs on one node differ)

    def columns(self) -> dict:
        """The row columns that say which job measured a case."""
        return {"slurm_job_id": self.job_id, "slurm_array_job_id": self.array_job_id,
                "slurm_array_task_id": self.array_task_id, "slurm_partition": self.partition,
                "slurm_node": self.node, "slurm_job_gpus": self.gpus}

    def to_json(self) -> dict:
        return asdict(self)


def this_job(environ=None) -> JobIdentity | None:
    env = os.environ if environ is None else environ
    if env.get("SLURM_JOB_ID") and env.get("SUBMITIT_EXECUTOR", "slurm") == "slurm":
        array_job, task = env.get("SLURM_ARRAY_JOB_ID", ""), env.get("SLURM_ARRAY_TASK_ID", "")
        return JobIdentity("slurm", f"{array_job}_{task}" if array_job and task else env["SLURM_JOB_ID"], array_job,
                           task, env.get("SLURM_JOB_PARTITION", ""), env.get("SLURMD_NODENAME") or socket.gethostname(),
                           env.get("SLURM_JOB_GPUS") or env.get("SLURM_STEP_GPUS") or "")
    if env.get("SUBMITIT_LOCAL_JOB_ID"):
        return JobIdentity("local", env["SUBMITIT_LOCAL_JOB_ID"], node=socket.gethostname())
    return None


class StopRequested(KeyboardInterrupt):
    """The job was told to end. A KeyboardInterrupt, so the worker manager kills the running worker
    (and everything it started) exactly as for Ctrl-C."""


class StopSignals:
    """While active: SIGTERM, SIGINT and submitit's USR2 set `signum`; while armed (a worker is
    running) they also raise StopRequested, so the wait for the worker ends at once."""

    def __init__(self, job: JobIdentity | None, runner: Runner = run_command, clock=time.time):
        self.job, self.runner, self.clock = job, runner, clock
        self.signum: int | None = None
        self.at: float | None = None
        self.armed = False
        self._previous: dict = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def _handle(self, signum, frame) -> None:
        if self.signum is None:
            self.signum, self.at = signum, self.clock()
        if self.armed:
            self.armed = False
            raise StopRequested

    def __enter__(self) -> StopSignals:
        usr = getattr(signal, "SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2"), signal.SIGUSR2)
        for signum in (signal.SIGTERM, signal.SIGINT, usr):
            with contextlib.suppress(ValueError):  # not the main thread
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)

    def status_and_reason(self) -> tuple[str, str]:
        """(row status, reason) for a case the stop cut short. SLURM's Reason says TimeLimit for the
        time limit; preemption says so in the job's state; anything else is a cancel (scancel, or the
        parent's Ctrl-C)."""
        name = signal.Signals(self.signum).name if self.signum else "a signal"
        job = self.job
        label = f"SLURM job {job.job_id}" + (f" (partition {job.partition}, node {job.node})" if job.partition
                                             else "") \
            if job and job.cluster == "slurm" else (f"job {job.job_id}" if job else "the job")
        known = parse_scontrol(self.runner(["scontrol", "show", "job", job.job_id]) or "", job.job_id) \
            if job and job.cluster == "slurm" else None
        reason, state = (known.reason, known.state) if known else ("", "")
        if "TimeLimit" in reason or state in ("TIMEOUT", "DEADLINE"):
            return "time_limit", f"{label} reached its time limit ({name})"
        if "Preempt" in reason or state == "PREEMPTED":
            return "preempted", f"{label} was preempted ({name})"
        if self.signum not in (signal.SIGTERM, signal.SIGINT):  # USR2 alone: the warning before the limit
            return "time_limit", f"{label} was warned of its time limit ({name})"
        return "cancelled", f"{label} was cancelled ({name}: scancel, or the parent's Ctrl-C)"
