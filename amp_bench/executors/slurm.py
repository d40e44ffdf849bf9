"""Submitting a study's jobs to SLURM with submitit (sbatch job arrays), or with submitit's local
executor (the same jobs as processes on this machine: the tests, a dry run before a cluster).

A job runs a callable of the study's on its node (submitit pickles it by reference: amp_bench must be
importable there, as it is from a shared filesystem or the same image). What a partition's nodes have
comes from sinfo, so `device: auto` plans GPU cases only where there are GPUs.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from amp_bench.errors import UserError
from amp_bench.executors.job_states import Runner, run_command
from amp_bench.suite.executor import ExecutorSpec

INSTALL_HINT = "pip install -e '.[slurm]' (submitit)"


def _submitit():
    try:
        import submitit
    except ImportError:
        raise UserError(f"--executor slurm needs submitit, which is not installed: {INSTALL_HINT}") from None
    return submitit


@dataclass(frozen=True)
class Partition:
    name: str
    gres: str = ""  # sinfo's GRES of its nodes (gpu:a100:4), "" for none
    cpus: int | None = None
    known: bool = True  # sinfo listed it

    @property
    def has_gpus(self) -> bool:
        return bool(re.search(r"\bgpu\b", self.gres))


def partitions(names: list[str], cluster: str, runner: Runner = run_command) -> dict[str, Partition]:
    """The named partitions as sinfo sees them; an unknown one is refused in one line, with the list."""
    if cluster == "local":
        return {n: Partition(n) for n in names}
    text = runner(["sinfo", "-h", "-o", "%R|%G|%c"])
    if text is None:
        raise UserError("--executor slurm: sinfo did not answer: is this a SLURM login node? "
                        "(scripts/slurm_local.sh start runs a one-node SLURM here)")
    seen: dict[str, Partition] = {}
    for line in text.splitlines():
        name, _, rest = line.strip().partition("|")
        gres, _, cpus = rest.partition("|")
        name = name.rstrip("*")
        gres = "" if gres in ("(null)", "") else gres
        old = seen.get(name)
        seen[name] = Partition(name, ",".join(filter(None, {old.gres if old else "", gres})),
                               int(cpus) if cpus.strip().isdigit() else None)
    unknown = [n for n in names if n not in seen]
    if unknown:
        raise UserError(f"--slurm-partition: no partition {', '.join(map(repr, unknown))} on this cluster "
                        f"(sinfo lists: {', '.join(sorted(seen)) or 'none'})")
    return {n: seen[n] for n in names}


def parameters(spec: ExecutorSpec, partition: Partition, time_min: int, gpus: int, name: str) -> dict:
    """submitit AutoExecutor parameters for one partition's jobs."""
    params = {"name": name, "timeout_min": int(time_min), "gpus_per_node": gpus, "tasks_per_node": 1,
              "cpus_per_task": spec.cpus_per_task or partition.cpus, "mem_gb": spec.mem_gb}
    if spec.cluster == "slurm":
        params.update(slurm_partition=partition.name, slurm_gres=spec.gres, slurm_constraint=spec.constraint,
                      slurm_account=spec.account, slurm_qos=spec.qos, slurm_array_parallelism=spec.tasks,
                      slurm_setup=list(spec.setup) or None, slurm_exclusive=spec.exclusive or None,
                      slurm_additional_parameters=dict(spec.sbatch) or None)
        if spec.gres:  # gres names the GPUs itself; asking --gpus-per-node too would double the request
            params.pop("gpus_per_node")
    else:
        params.update(local_setup=list(spec.setup) or None)
    return {k: v for k, v in params.items() if v is not None}


def submit(spec: ExecutorSpec, partition: Partition, folder: Path, fn: Callable, arg_lists: list[tuple],
           time_min: int, gpus: int, name: str) -> list[str]:
    """One job per argument tuple (an array on SLURM); their job ids ('123_0', ... or local pids)."""
    submitit = _submitit()
    executor = submitit.AutoExecutor(folder=str(folder), cluster=spec.cluster)
    executor.update_parameters(**parameters(spec, partition, time_min, gpus, name))
    try:
        jobs = [executor.submit(fn, *arg_lists[0])] if len(arg_lists) == 1 else \
            executor.map_array(fn, *zip(*arg_lists, strict=True))
    except Exception as exc:  # sbatch's refusal (a bad account, partition, gres) in one line
        first = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        raise UserError(f"partition {partition.name}: the jobs could not be submitted: {first}") from None
    return [str(job.job_id) for job in jobs]
