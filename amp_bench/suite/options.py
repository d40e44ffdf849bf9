"""Every command-line option that sets a suite field, declared once, beside the field tables: its flag,
the field it sets and that field's block (as schema.DEFAULTS names it), the commands that take it, its
type, help and form, and whether only a SLURM job honours it. From OPTIONS the CLI builds each command's
options, their overrides and the note on SLURM options a local run leaves unused (cli/run.py), and checks
each value with its field's own check, so the command line and a suite file agree on every limit
(cli/values.py). Every option defaults to None: the suite's value, else schema.DEFAULTS'."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from amp_bench.suite import executor, fields


@dataclass(frozen=True)
class Option:
    flag: str
    setting: str | None  # the field it sets; None: the command reads it itself (--detach)
    block: str
    commands: tuple[str, ...]
    convert: Callable = str  # the command line's text -> the field's type
    help: str | None = None
    given: str = "value"  # or values (repeatable: items of a list field), on, off (a switch), on_off (--x/--no-x)
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    bare: str | None = None  # the value of the flag given alone (--compile)
    slurm_only: bool = False  # a local run says it is not used

    @property
    def dest(self) -> str:
        return self.flag[2:].replace("-", "_")

    def check(self) -> Callable:
        """The field's own check (fields.py, executor.py), built when a value is read."""
        tables = {"settings": lambda: fields._setting_fields(()), "fidelity": fields._fidelity_fields,
                  "headroom": lambda: fields.HEADROOM_FIELDS, "executor": lambda: executor.FIELDS}
        return tables[self.block]()[self.setting]


RUN, RUNS, STUDIES = ("run",), ("run", "explain"), ("run", "fidelity", "headroom")


def _setting(flag: str, setting: str, commands: tuple[str, ...], convert: Callable = str, **how) -> Option:
    return Option(flag, setting, "settings", commands, convert, **how)


def _slurm(flag: str, setting: str | None, convert: Callable = str, **how) -> Option:
    return Option(flag, setting, "executor", STUDIES, convert, slurm_only=True, **how)


OPTIONS: tuple[Option, ...] = (
    Option("--epochs", "epochs", "fidelity", ("fidelity",), int),
    Option("--batch-size", "batch_size", "fidelity", ("fidelity",), int),
    Option("--seed", "seeds", "fidelity", ("fidelity",), int, given="values",
           help="repeatable; replaces the section's seeds"),
    Option("--precision", "precisions", "fidelity", ("fidelity",), given="values",
           help="repeatable; fp32 always runs as the reference"),
    Option("--tolerance-pp", "tolerance_pp", "fidelity", ("fidelity",), float,
           help="accuracy difference (percentage points) still called parity"),
    Option("--memory-cap-gb", "memory_cap_gb", "headroom", ("headroom",), float,
           help="GPU: allocator cap; CPU: address space above bare torch"),
    Option("--start-batch-size", "start_batch_size", "headroom", ("headroom",), int),
    Option("--max-batch-size", "max_batch_size", "headroom", ("headroom",), int),
    Option("--resolution", "resolution", "headroom", ("headroom",), int,
           help="stop bisecting when fit and OOM are this close (default 1)"),
    _setting("--steps", "steps", RUNS, int, help="a fixed number of measured steps per case"),
    _setting("--target-ci", "target_ci", RUN, float, help="measure each case until the 95%% interval of its median "
             "step time is within +-this share of it (e.g. 0.01), its budget is spent or --max-steps"),
    _setting("--min-steps", "min_steps", RUN, int, help="adaptive window: never fewer measured steps"),
    _setting("--max-steps", "max_steps", RUN, int, help="adaptive window: never more measured steps"),
    _setting("--case-budget", "case_budget_s", RUN, float, metavar="SECONDS",
             help="measuring budget per case and repeat"),
    _setting("--budget", "budget_s", RUNS, float, metavar="SECONDS", help="the whole run's budget, shared out "
             "among the cases still to run (a case's min_steps wins over it)"),
    _setting("--allow-emulated", "allow_emulated", RUNS, given="on", help="also run modes this hardware only "
             "emulates (bf16/fp16 on a CPU without the ISA, bf16 below Ampere); labelled emulated"),
    _setting("--warmup-steps", "warmup_steps", RUN, int),
    _setting("--repeats", "repeats", RUNS, int),
    _setting("--batch-size", "batch_sizes", RUNS, int, given="values", help="repeatable; replaces batch_sizes"),
    _setting("--precision", "precisions", (*RUNS, "headroom"), given="values",
             help="repeatable; replaces precisions"),
    _setting("--timeout-s", "timeout_s", ("run", "headroom"), float,
             help="a worker's time limit: per case and repeat (headroom: per probe)"),
    Option("--no-measure", "measure", "headroom", ("headroom",), given="off",
           help="skip the throughput measurement at each maximum"),
    _setting("--nproc-per-node", "nproc_per_node", RUN, int, given="values", help="repeatable; replaces "
             "nproc_per_node: run each case with DDP under torchrun on this many processes (e.g. --nproc-per-node 1 "
             "--nproc-per-node 2)"),
    _setting("--compile", "compile", RUN, given="values", bare="true", metavar="MODE", help="repeatable; replaces "
             "the compile axis: false (eager), true/default, reduce-overhead, max-autotune (e.g. --compile false "
             "--compile true); alone it means the default mode, as compile: true does in a suite"),
    _setting("--compile-backend", "compile_backend", RUN, help="torch.compile backend (default inductor)"),
    _setting("--compile-fullgraph", "compile_fullgraph", RUN, given="on", help="fullgraph=True: a graph break "
             "fails the case (status compile_error)"),
    _setting("--compile-optimizer", "compile_optimizer", RUN, given="on", help="compile the optimizer step too"),
    _setting("--compile-cache", "compile_cache", RUN, choices=fields.COMPILE_CACHES, help="inductor/triton cache: "
             "warm, one per run shared by its cases; cold, an empty one per case"),
    _setting("--seed", "seed", RUN, int),
    _setting("--explain", "explain", RUN, given="on_off", help="profile one more step per case after its window: "
             "where the time goes, per category (on by default; the suite key explain: false or --no-explain turns "
             "it off)"),
    _setting("--isolation", "isolation", RUN, choices=fields.ISOLATIONS, help="how each case's worker starts: fork "
             "(default), a child of one server that imported torch and the models' libraries once; spawn, a fresh "
             "interpreter per case (3-7 s of imports each)"),
    _setting("--on-contention", "on_contention", RUN, choices=fields.ON_CONTENTION, help="stop (default): a case "
             "whose worker other processes hold under 85%% of its cores for 3 s is stopped as contended, with the "
             "evidence, and retried once at the end if the machine is quiet then; flag: it runs on, its row says so"),
    _setting("--cpu-allocator", "cpu_allocator", RUN, choices=fields.CPU_ALLOCATORS, help="keep (default): a CPU "
             "case's worker keeps the memory it frees for reuse, so its steps do not page-fault their activations "
             "in again; system: glibc's defaults, as a plain training script has them"),
    _setting("--peak-tflops", "peak_tflops", RUN, float, help="dense peak TFLOP/s for MFU, for every precision of "
             "the run (overrides the built-in table; a suite's peak_tflops mapping sets one per precision)"),
    Option("--executor", "type", "executor", STUDIES, choices=executor.EXECUTORS, help="local: here (default); "
           "slurm: SLURM jobs through submitit, one run directory per partition"),
    _slurm("--slurm-partition", "partitions", metavar="P1,P2", help="the partitions to run the suite on, each in full"),
    _slurm("--slurm-gpus-per-node", "gpus_per_node", int, metavar="N", help="GPUs per job (default: 1 on a "
           "partition whose nodes have GPUs, else 0)"),
    _slurm("--slurm-gres", "gres", help="a --gres request instead (e.g. gpu:a100:1)"),
    _slurm("--slurm-constraint", "constraint"),
    _slurm("--slurm-account", "account"),
    _slurm("--slurm-qos", "qos"),
    _slurm("--slurm-time", "time_min", int, metavar="MINUTES", help="each job's time limit (default: its cases' "
           "timeouts added up, plus 10 minutes)"),
    _slurm("--slurm-cpus-per-task", "cpus_per_task", int),
    _slurm("--slurm-mem-gb", "mem_gb", float),
    _slurm("--slurm-setup", "setup", given="values", metavar="LINE", help="repeatable: a shell line the job runs "
           "first (module load cuda, source a venv)"),
    _slurm("--slurm-exclusive", "exclusive", given="on_off", help="a node to itself (default: yes; a job beside a "
           "benchmark shares its CPU and PCIe)"),
    _slurm("--slurm-tasks", "tasks", int, metavar="N", help="jobs per partition, each with whole model-and-batch "
           "groups (default 1)"),
    _slurm("--slurm-cluster", "cluster", choices=executor.CLUSTERS, help="local: submitit's local executor (the "
           "jobs as processes on this machine: a dry run of a cluster run)"),
    _slurm("--detach", None, given="on", help="submit and return: the jobs write their rows; `amp_bench status "
           "RESULTS_DIR` shows progress, `run --resume RUN_DIR` what died"),
)


def taken_by(command: str) -> tuple[Option, ...]:
    """The options `command` takes, in the order its --help lists them."""
    return tuple(option for option in OPTIONS if command in option.commands)
