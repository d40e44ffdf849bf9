"""Where a suite's cases run: the `executor:` block of a suite file (and the CLI's --executor and
--slurm-* options, through the same checks), as one value object, ExecutorSpec.

    executor:
      type: slurm                  # local (default: this machine, one case after another) | slurm
      partitions: [a100, h100]     # the same suite on each: one run directory per partition
      gpus_per_node: 1             # null: 1 on a partition whose nodes have GPUs (sinfo), else 0
      time_min: 120                # the job's time limit; null: its cases' timeouts added up, + 10 min
      account: mylab
      setup: ["module load cuda/12.4", "source ~/venvs/amp/bin/activate"]

Defaults are schema.DEFAULTS["executor"]; nothing here imports submitit (amp_bench.executors does).
"""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace

from amp_bench.errors import SuiteError
from amp_bench.suite import checks
from amp_bench.suite.checks import Problems
from amp_bench.suite.schema import DEFAULTS

EXECUTORS = ("local", "slurm")
CLUSTERS = ("slurm", "local")  # submitit's: slurm (sbatch), local (the jobs as processes here: tests, dry runs)
_DEFAULTS = DEFAULTS["executor"]
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")


def _name_list(what: str) -> Callable:
    def check(value, path, problems):
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, list) or not items:
            problems.append(f"{path}: expected a non-empty list of {what} names, got {value!r}")
            return None
        out = []
        for i, item in enumerate(items):
            item = item.strip() if isinstance(item, str) else item
            if not isinstance(item, str) or not _NAME.fullmatch(item):
                problems.append(f"{path}[{i}]: expected a {what} name (letters, digits, _.+-), got {item!r}")
                return None
            if item in out:
                problems.append(f"{path}[{i}]: {item!r} is listed twice")
                return None
            out.append(item)
        return out
    return check


def _lines(value, path, problems):
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(x, str) for x in items):
        problems.append(f"{path}: expected a list of shell lines, got {value!r}")
        return None
    return list(items)


def _sbatch_options(value, path, problems):
    if checks.mapping(value, path, problems) is None:
        return None
    out = {}
    for key, item in value.items():
        if not isinstance(key, str) or not re.fullmatch(r"[a-z][a-z0-9-]*", key):
            problems.append(f"{checks.join(path, str(key))}: expected an sbatch option name such as reservation")
            return None
        if not isinstance(item, (str, int, float, bool)):
            problems.append(f"{checks.join(path, key)}: expected a string or number, got {item!r}")
            return None
        out[key] = item
    return out


FIELDS: dict[str, Callable] = {
    "type": checks.choice(EXECUTORS),
    "partitions": _name_list("partition"),
    "cluster": checks.choice(CLUSTERS),
    "gpus_per_node": checks.optional(checks.integer(0, 64, "a GPU count")),
    "gres": checks.optional(checks.text),
    "cpus_per_task": checks.optional(checks.integer(1, 4096, "a CPU count")),
    "mem_gb": checks.optional(checks.number(0, 1e5)),
    "constraint": checks.optional(checks.text),
    "account": checks.optional(checks.text),
    "qos": checks.optional(checks.text),
    "time_min": checks.optional(checks.integer(1, 30 * 24 * 60, "minutes")),
    "setup": _lines,
    "exclusive": checks.boolean,
    "tasks": checks.integer(1, 4096, "a job count"),
    "sbatch": _sbatch_options,
    "poll_s": checks.number(0, 3600),
}


@dataclass(frozen=True)
class ExecutorSpec:
    """Where and how a study's cases run. `local`: here, one after another (today's runs). `slurm`: as
    SLURM jobs through submitit, `tasks` jobs (an array) per partition, each running its share of the
    cases one after another in fresh worker processes as a local run does, but each started as a fresh
    interpreter (a job starts no fork server), so a CPU job runs its repeats' modes one after another,
    not in lockstep (docs/measuring.md)."""
    type: str = _DEFAULTS["type"]
    partitions: tuple[str, ...] = ()
    cluster: str = _DEFAULTS["cluster"]
    gpus_per_node: int | None = _DEFAULTS["gpus_per_node"]
    gres: str | None = _DEFAULTS["gres"]
    cpus_per_task: int | None = _DEFAULTS["cpus_per_task"]
    mem_gb: float | None = _DEFAULTS["mem_gb"]
    constraint: str | None = _DEFAULTS["constraint"]
    account: str | None = _DEFAULTS["account"]
    qos: str | None = _DEFAULTS["qos"]
    time_min: int | None = _DEFAULTS["time_min"]
    setup: tuple[str, ...] = ()
    exclusive: bool = _DEFAULTS["exclusive"]
    tasks: int = _DEFAULTS["tasks"]
    sbatch: dict = field(default_factory=dict)
    poll_s: float = _DEFAULTS["poll_s"]

    @property
    def remote(self) -> bool:
        return self.type != "local"

    def to_json(self) -> dict:
        return {f.name: (list(v) if isinstance(v := getattr(self, f.name), tuple) else v) for f in fields(self)}

    @classmethod
    def from_json(cls, data: dict) -> ExecutorSpec:
        known = {f.name for f in fields(cls)}
        data = {k: v for k, v in (data or {}).items() if k in known}
        for key in ("partitions", "setup"):
            if key in data:
                data[key] = tuple(data[key] or ())
        return cls(**data)


def validate_executor(value, path: str, problems: Problems) -> dict | None:
    """The `executor:` block: its fields checked, one line per problem."""
    return checks.validate_section(value, path, problems, FIELDS)


def executor_spec(block: dict | None, overrides: dict | None = None, source: str = "") -> ExecutorSpec:
    """The suite's block (validated), then the CLI's overrides (each checked again, as `override.KEY`): an
    ExecutorSpec. A slurm executor without partitions is refused."""
    problems: Problems = []
    given = dict(block or {})
    for key, value in (overrides or {}).items():
        if value is None:
            continue
        if key not in FIELDS:
            problems.append(f"override {key!r}: unknown executor setting (expected one of: {', '.join(FIELDS)})")
            continue
        checked = FIELDS[key](value, checks.join("override", key), problems)
        if checked is not None:
            given[key] = checked
    for key in ("partitions", "setup"):
        if key in given:
            given[key] = tuple(given[key])
    spec = replace(ExecutorSpec(), **given) if not problems else ExecutorSpec()
    if not problems and spec.remote and not spec.partitions:
        problems.append("executor.partitions: missing (the slurm executor needs at least one partition: "
                        "--slurm-partition a100,h100 or executor: {partitions: [a100, h100]})")
    if problems:
        raise SuiteError([f"{source}: {p}" if source else p for p in problems])
    return spec
