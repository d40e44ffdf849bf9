"""The suite's value objects and DEFAULTS, the one table of every suite field's default.

DEFAULTS is shaped like a suite file: the file's own fields, the run settings, an optimizer mapping,
a `models:` entry, and the `fidelity:` and `headroom:` sections. The loader, the matrix expansion,
the study specs and the dataclass defaults below all read it; no default is written anywhere else.

The value objects: OptimizerSpec, ModelSpec, Case (one cell of the matrix, what a worker runs),
FidelitySpec and HeadroomSpec (Suite, a validated file and its expansion, is in matrix.py).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from amp_bench import identity
from amp_bench.identity import EAGER

# --------------------------------------------------------------------------- defaults
# A None marked "derived" is computed where the field is read (load.py, fields.py, matrix.py) from what
# the comment names; other Nones are passed on as they are and mean what their comment says.

_OPTIMIZER: dict[str, Any] = {"name": "sgd", "impl": "foreach", "lr": 0.01, "momentum": 0.9, "weight_decay": 0.0}

# fidelity: the shipped datasets a suite may name (amp_bench.studies.fidelity.datasets loads them), and
# the model each trains when the suite names none
DATASETS = ("digits", "breast_cancer")
DEFAULT_MODELS = {"digits": "small_cnn", "breast_cancer": "tabular_transformer"}

DEFAULTS: dict[str, dict[str, Any]] = {
    # the file's own fields (top level only)
    "suite": {
        "name": None,  # derived: the file name without its extension
        "description": "", "device": "auto",
    },
    # run settings: top level, replaced per device type by a cpu:/cuda: block, then by overrides.
    # models and batch_sizes have none: the matrix needs both (a fidelity-only suite has neither).
    "settings": {
        "image_size": [224], "seq_len": [128], "channels_last": [False], "precisions": ["fp32", "amp_bf16"],
        "warmup_steps": 5, "steps": 20,
        # the adaptive window (docs/measuring.md): with target_ci or a budget, a case measures
        # until the 95% interval of its median is within +-target_ci, its budget is spent or max_steps
        # is reached, never fewer than min_steps; without them, exactly `steps`
        "target_ci": None, "min_steps": 5, "max_steps": 1000,
        "case_budget_s": None,  # seconds of measuring per case and repeat
        "budget_s": None,  # the whole run: the runner shares what is left among the cases still to run
        "repeats": 1, "seed": 0, "timeout_s": 600.0, "allow_emulated": False,
        # 1: every repeat a fresh worker; N: N repeats of a case are windows of one worker, which pays its start,
        # build and cuDNN autotuning (or compile) once (docs/measuring.md, "Repeats and paired speedups")
        "repeats_per_worker": 1,
        "cudnn_benchmark": True, "nvml_interval_ms": 10.0, "optimizer": _OPTIMIZER,
        "peak_tflops": None,  # None: the built-in peak table (peaks.py)
        # distributed (docs/distributed.md): no nproc_per_node = one plain process, no torchrun
        "nproc_per_node": [None], "nnodes": 1, "dist_backend": "auto",
        "threads_per_rank": None,  # None, when the case runs: the node's cores / nproc_per_node (measure/ddp.py)
        "rdzv_endpoint": None,
        "rdzv_id": None,  # None, when the case runs: the suite's name (launchers/launch.py)
        # torch.compile (docs/measuring.md): an axis of modes; false is eager, true is "default"
        "compile": [False], "compile_backend": "inductor", "compile_fullgraph": False,
        "compile_optimizer": False,  # true: the optimizer step is compiled too, not only the model
        "compile_cache": "warm",  # warm: one inductor cache per run, shared; cold: an empty one per case
        "compile_precisions": None,  # None: every precision is compiled; a list: only these are
        "compile_timeout_s": None,  # a compiled case's timeout_s (fp8 trains compiled): None, the suite's
        # one more step per case under torch.profiler, after its window: where the time goes (analysis/explain/).
        # On by default: it kept the main job (resnet50, 2-core CPU) at 113 s and the smoke suite unchanged
        "explain": True,
        # fork: each case's worker is a child of one server that imported torch and the models' libraries
        # (launchers/forkserver.py); spawn: a fresh interpreter per case (DDP cases always are)
        "isolation": "fork",
        # stop: the parent stops a case whose worker other processes held under 85% of its cores for 3 s
        # (launchers/busy.py), status contended with the evidence, retried once at the end if the machine
        # is quiet then; flag: it runs to the end and the row says contended (AMP_BENCH_ON_CONTENTION overrides)
        "on_contention": "stop",
        # auto: on the CPU a repeat's modes run in lockstep (their workers alive together, taking turns of
        # ~50 ms; launchers/lockstep.py), elsewhere one worker after another; repeats: always one after
        # another; steps: lockstep, with a note where it cannot be had (GPU, DDP, compiled, spawn)
        "interleave": "auto",
        # keep: a CPU case's worker keeps the memory it frees for reuse (no block from glibc's mmap, no
        # trimming; measure/devices/cpu.py), as CUDA's caching allocator does, so a step does not
        # page-fault its activations in again; system: glibc's defaults (what a plain training script gets)
        "cpu_allocator": "keep",
        # fp8 (torchao float8 on the linear layers; docs/fp8.md)
        "fp8_recipe": "tensorwise",  # or rowwise (per-row scales: slower, more accurate)
        "fp8_skip_first_last": False,  # true: the first and last linear layers stay in bf16
        "fp8_compile": True,  # fp8 trains compiled where the compile axis says eager: float8 is only fast so
    },
    # what an optimizer mapping leaves out (in the settings and in the fidelity section alike)
    "optimizer": _OPTIMIZER,
    # a `models:` entry (a bare string is {ref: ...}; ref has no default)
    "model": {
        "label": None,  # derived: the reference's short name (resnet50, gpt2, the callable's name)
        "config": {}, "task": None, "attn_implementation": None, "options": {}, "num_classes": None,
        "nproc_per_node": None,  # None: the suite's nproc_per_node
        "compile": None,  # None: the suite's compile axis
        "precisions": None,  # None: the suite's precisions
        "explain": None,  # None: the suite's explain
        "pad_vocab_to_multiple_of": None,  # transformers: None keeps the config's vocabulary as it is
    },
    "fidelity": {
        "dataset": "digits",
        "model": None,  # derived: the dataset's own model (datasets.DEFAULT_MODELS)
        "epochs": 10, "batch_size": 64,
        "seeds": None,  # derived: [the suite's seed]
        "precisions": None,  # derived: the suite's precisions (fp32, the reference, always runs first)
        # used when the section names no optimizer at all; a partial mapping is filled from "optimizer"
        "optimizer": {**_OPTIMIZER, "lr": 0.05},
        "test_fraction": 0.25,
        "image_size": 32,  # torchvision models only (the digits are upsampled to it)
        "tolerance_pp": 1.0, "probe_every": 0,
        "timeout_s": None,  # derived: the suite's timeout_s
        "compile": None,  # derived: eager; a mode (default, reduce-overhead, max-autotune) trains compiled
    },
    # where the cases run (suite/executor.py): this machine, or SLURM jobs through submitit (docs/cluster.md)
    "executor": {
        "type": "local", "partitions": [], "cluster": "slurm",
        "gpus_per_node": None,  # derived: 1 on a partition whose nodes have GPUs (sinfo's GRES), else 0
        "gres": None, "cpus_per_task": None, "mem_gb": None, "constraint": None, "account": None, "qos": None,
        "time_min": None,  # derived: the job's cases' timeouts added up, plus 10 minutes (at most 24 h)
        "setup": [],  # shell lines the job script runs first (module load, source a venv)
        # a benchmark wants its node alone: a job beside it shares the host CPU, PCIe and memory bandwidth
        "exclusive": True,
        "tasks": 1,  # jobs per partition (an array); a model-and-batch group always stays on one node
        "sbatch": {},  # more sbatch options, as sbatch spells them (reservation: x)
        "poll_s": 5.0,  # how often the parent looks at its jobs
    },
    "headroom": {
        "memory_cap_gb": None,  # None: no cap on a GPU; on the CPU half the memory available (headroom.py)
        "start_batch_size": None,  # derived: the smallest of the suite's batch_sizes (1 without any)
        "max_batch_size": 4096, "resolution": 1, "probe_steps": 2, "measure": True,
    },
}

_SETTINGS, _MODEL = DEFAULTS["settings"], DEFAULTS["model"]
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
FP8_RECIPES = ("tensorwise", "rowwise")


def compile_mode_name(value) -> str:
    """A `compile:` value as the case carries it: false -> eager, true -> default, a mode as it is."""
    if value is True:
        return "default"
    return EAGER if value in (False, None, "false", EAGER) else value


# --------------------------------------------------------------------------- value objects

@dataclass(frozen=True)
class OptimizerSpec:
    name: str = _OPTIMIZER["name"]
    impl: str = _OPTIMIZER["impl"]
    lr: float = _OPTIMIZER["lr"]
    momentum: float = _OPTIMIZER["momentum"]
    weight_decay: float = _OPTIMIZER["weight_decay"]


@dataclass(frozen=True)
class ModelSpec:
    ref: str
    label: str
    config: dict = field(default_factory=lambda: dict(_MODEL["config"]), hash=False, compare=True)
    task: str | None = _MODEL["task"]
    attn_implementation: str | None = _MODEL["attn_implementation"]
    options: dict = field(default_factory=lambda: dict(_MODEL["options"]), hash=False, compare=True)
    num_classes: int | None = _MODEL["num_classes"]
    # replaces the suite's nproc_per_node for this model
    nproc_per_node: tuple[int, ...] | None = _MODEL["nproc_per_node"]
    compile: tuple[str, ...] | None = _MODEL["compile"]  # replaces the suite's compile axis for this model
    precisions: tuple[str, ...] | None = _MODEL["precisions"]  # replaces the suite's precisions for this model
    explain: bool | None = _MODEL["explain"]  # replaces the suite's explain for this model
    # transformers: the vocabulary padded up to a multiple of this (embedding and lm_head; nanoGPT's 50304)
    pad_vocab_to_multiple_of: int | None = _MODEL["pad_vocab_to_multiple_of"]

    @property
    def kind(self) -> str:
        from amp_bench.suite import model_refs
        return model_refs.kind_of(self.ref) or ""


@dataclass(frozen=True, kw_only=True)
class TrainingSettings:
    """How the model trains, beside its precision: eager or a torch.compile mode, and the fp8 recipe.
    One definition for a benchmark case and the fidelity study (both inherit it, so a row, a worker
    spec and the JSON between them carry the same flat fields)."""
    compile_mode: str = EAGER  # eager, or one value of the settings' compile axis, normalised (compiling.py)
    compile_backend: str = _SETTINGS["compile_backend"]
    compile_fullgraph: bool = _SETTINGS["compile_fullgraph"]
    fp8_recipe: str = _SETTINGS["fp8_recipe"]
    explain: bool = _SETTINGS["explain"]  # profile one more step after the window (measure/telemetry/profile.py)
    fp8_skip_first_last: bool = _SETTINGS["fp8_skip_first_last"]

    @property
    def compiled(self) -> bool:
        return self.compile_mode != EAGER


@dataclass(frozen=True)
class Case(TrainingSettings):
    """One cell of the matrix: everything a worker needs to run it.

    The defaults (the settings' defaults) let code build a Case by hand and read records written before a
    field existed."""
    suite: str
    model: ModelSpec
    batch_size: int
    precision: str
    channels_last: bool
    image_size: int | None
    seq_len: int | None
    warmup_steps: int
    steps: int
    repeats: int
    optimizer: OptimizerSpec
    seed: int
    timeout_s: float
    allow_emulated: bool
    cudnn_benchmark: bool = _SETTINGS["cudnn_benchmark"]
    target_ci: float | None = _SETTINGS["target_ci"]
    min_steps: int = _SETTINGS["min_steps"]
    max_steps: int = _SETTINGS["max_steps"]
    case_budget_s: float | None = _SETTINGS["case_budget_s"]
    budget_s: float | None = _SETTINGS["budget_s"]
    peak_tflops: float | None = None  # the user's peak for MFU (one precision's), overriding the built-in table
    nvml_interval_ms: float = _SETTINGS["nvml_interval_ms"]
    on_contention: str = _SETTINGS["on_contention"]  # stop: a case the machine starves is stopped early
    interleave: str = _SETTINGS["interleave"]  # auto/steps: a CPU repeat's modes in lockstep; repeats: one by one
    repeats_per_worker: int = _SETTINGS["repeats_per_worker"]  # consecutive repeats measured as windows of one worker
    cpu_allocator: str = _SETTINGS["cpu_allocator"]  # keep: freed memory kept for reuse; system: glibc's defaults
    search_dirs: tuple[str, ...] = ()
    memory_cap_bytes: int | None = None  # headroom probes: DeviceOps.cap_memory
    instrument: bool = True  # the per-phase memory step (and its peak rates) after the window (probes skip it)
    count_flops: bool = True  # count the step's FLOPs after the window (a run counts once: studies/flop_counts.py)
    # DDP under torchrun when nproc_per_node is set (even to 1); None: one plain worker process
    nproc_per_node: int | None = _SETTINGS["nproc_per_node"][0]  # one value of the settings' axis
    nnodes: int = _SETTINGS["nnodes"]
    dist_backend: str = _SETTINGS["dist_backend"]
    threads_per_rank: int | None = _SETTINGS["threads_per_rank"]
    rdzv_endpoint: str | None = _SETTINGS["rdzv_endpoint"]
    rdzv_id: str | None = _SETTINGS["rdzv_id"]
    compile_optimizer: bool = _SETTINGS["compile_optimizer"]
    compile_cache: str = _SETTINGS["compile_cache"]
    compile_note: str = ""  # why the case is compiled when the suite's axis said eager (fp8_compile)
    variant: str = ""  # the advice item it tries (run --try, e.g. optimizer_impl=fused); "" for a suite's own

    @property
    def distributed(self) -> bool:
        return self.nproc_per_node is not None

    @property
    def world_size(self) -> int:
        return (self.nproc_per_node or 1) * self.nnodes

    @property
    def axes(self) -> dict:
        """The case's value on each axis that makes a case (identity.CASE_AXES), as its rows carry them."""
        named = {"model_label": self.model.label, "world_size": self.world_size}
        return {axis: named[axis] if axis in named else getattr(self, axis, None) for axis in identity.CASE_AXES}

    @property
    def group_id(self) -> str:
        return identity.group_id(self.axes)

    @property
    def case_id(self) -> str:
        return identity.case_id(self.axes, self.precision)

    def to_json(self) -> dict:
        data = asdict(self)
        data["search_dirs"] = list(self.search_dirs)
        return data

    @classmethod
    def from_json(cls, data: dict) -> Case:
        data = dict(data)
        model = dict(data["model"])
        for key in ("nproc_per_node", "compile"):
            if model.get(key) is not None:
                model[key] = tuple(model[key])
        data["model"] = ModelSpec(**model)
        data["optimizer"] = OptimizerSpec(**data["optimizer"])
        data["search_dirs"] = tuple(data.get("search_dirs") or ())
        return cls(**data)


@dataclass(frozen=True)
class FidelitySpec(TrainingSettings):
    """The fidelity study: train on real shipped data under each precision, compare with fp32."""
    suite: str
    dataset: str
    model: str
    epochs: int
    batch_size: int
    seeds: tuple[int, ...]
    precisions: tuple[str, ...]  # fp32 first: it is the reference
    optimizer: OptimizerSpec
    test_fraction: float
    image_size: int | None  # torchvision models: digits are upsampled to this size
    tolerance_pp: float  # accuracy difference from fp32, in percentage points, still called parity
    probe_every: int  # gradient-underflow probe every N steps (0: at the start of every epoch)
    timeout_s: float
    allow_emulated: bool

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> FidelitySpec:
        data = dict(data)
        data["optimizer"] = OptimizerSpec(**data["optimizer"])
        data["seeds"], data["precisions"] = tuple(data["seeds"]), tuple(data["precisions"])
        return cls(**data)


@dataclass(frozen=True)
class HeadroomSpec:
    """The batch-size headroom search: doubling then bisection, one worker per probe."""
    memory_cap_bytes: int | None  # GPU: per-process allocator cap; CPU: address space above bare torch
    start_batch_size: int
    max_batch_size: int
    resolution: int  # bisect until the largest fitting and the smallest failing batch differ by this
    probe_steps: int
    measure: bool  # time a full measurement at each precision's largest batch
