"""Suite files: load YAML, validate every field with a one-line message per problem, expand to cases.

A suite is a matrix (models x image_size/seq_len x batch_sizes x channels_last x nproc_per_node x
precisions) plus run settings. A `cpu:` or `cuda:` block replaces top-level settings on that device type, so the
same file runs on a laptop with smaller batches and fewer steps.
"""
from __future__ import annotations

import difflib
import hashlib
import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

from amp_bench import models as model_refs
from amp_bench.errors import SuiteError
from amp_bench import modes

MAX_BATCH_SIZE = 65536
OPTIMIZERS = ("sgd", "adam", "adamw")
OPTIMIZER_IMPLS = ("for-loop", "foreach", "fused")
DEVICE_BLOCKS = ("cpu", "cuda")
DIST_BACKENDS = ("auto", "gloo", "nccl")
MAX_PROCS = 1024

DEFAULTS: dict[str, Any] = {
    "image_size": [224], "seq_len": [128], "channels_last": [False], "precisions": ["fp32", "amp_bf16"],
    "warmup_steps": 5, "steps": 20, "repeats": 1, "seed": 0, "timeout_s": 600.0, "allow_emulated": False,
    "cudnn_benchmark": True, "peak_tflops": None, "nvml_interval_ms": 10.0,
    "optimizer": {"name": "sgd", "impl": "foreach", "lr": 0.01, "momentum": 0.9, "weight_decay": 0.0},
    # distributed (docs/distributed.md): no nproc_per_node = one plain process, no torchrun
    "nproc_per_node": [None], "nnodes": 1, "dist_backend": "auto", "threads_per_rank": None,
    "rdzv_endpoint": None, "rdzv_id": None,
}


# --------------------------------------------------------------------------- value objects

@dataclass(frozen=True)
class OptimizerSpec:
    name: str = "sgd"
    impl: str = "foreach"
    lr: float = 0.01
    momentum: float = 0.9
    weight_decay: float = 0.0


@dataclass(frozen=True)
class ModelSpec:
    ref: str
    label: str
    config: dict = field(default_factory=dict, hash=False, compare=True)
    task: str | None = None
    attn_implementation: str | None = None
    options: dict = field(default_factory=dict, hash=False, compare=True)
    num_classes: int | None = None
    nproc_per_node: tuple[int, ...] | None = None  # replaces the suite's nproc_per_node for this model

    @property
    def kind(self) -> str:
        return model_refs.kind_of(self.ref) or ""


@dataclass(frozen=True)
class Case:
    """One cell of the matrix: everything a worker needs to run it."""
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
    cudnn_benchmark: bool = True
    peak_tflops: float | None = None  # the user's peak for MFU, overriding the built-in table
    nvml_interval_ms: float = 10.0
    search_dirs: tuple[str, ...] = ()
    memory_cap_bytes: int | None = None  # headroom probes: see measure.apply_memory_cap
    instrument: bool = True  # the FLOP and per-phase memory steps after the window (probes skip them)
    # DDP under torchrun when nproc_per_node is set (even to 1); None: one plain worker process
    nproc_per_node: int | None = None
    nnodes: int = 1
    dist_backend: str = "auto"
    threads_per_rank: int | None = None
    rdzv_endpoint: str | None = None
    rdzv_id: str | None = None

    @property
    def distributed(self) -> bool:
        return self.nproc_per_node is not None

    @property
    def world_size(self) -> int:
        return (self.nproc_per_node or 1) * self.nnodes

    @property
    def group_id(self) -> str:
        """Identity of the case without its precision: cases sharing it are compared."""
        parts = [self.model.label, f"bs{self.batch_size}"]
        if self.image_size:
            parts.append(f"{self.image_size}px")
        if self.seq_len:
            parts.append(f"seq{self.seq_len}")
        if self.channels_last:
            parts.append("cl")
        if self.distributed:  # keeps DDP cases apart from plain ones (and np1 from np2)
            parts.append(f"np{self.nproc_per_node}" if self.nnodes == 1 else f"{self.nnodes}x{self.nproc_per_node}")
        return "-".join(parts)

    @property
    def case_id(self) -> str:
        return f"{self.group_id}-{self.precision}"

    def to_json(self) -> dict:
        from dataclasses import asdict
        data = asdict(self)
        data["search_dirs"] = list(self.search_dirs)
        return data

    @classmethod
    def from_json(cls, data: dict) -> Case:
        data = dict(data)
        model = dict(data["model"])
        if model.get("nproc_per_node") is not None:
            model["nproc_per_node"] = tuple(model["nproc_per_node"])
        data["model"] = ModelSpec(**model)
        data["optimizer"] = OptimizerSpec(**data["optimizer"])
        data["search_dirs"] = tuple(data.get("search_dirs") or ())
        return cls(**data)


@dataclass(frozen=True)
class FidelitySpec:
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
        from dataclasses import asdict
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


@dataclass
class Suite:
    path: Path
    name: str
    description: str
    device: str
    sha256: str
    text: str
    settings: dict  # validated top-level settings (defaults filled in)
    blocks: dict  # device type -> validated override settings
    fidelity: dict | None = None  # validated `fidelity:` section (top level; blocks may override)
    headroom: dict | None = None

    @property
    def has_matrix(self) -> bool:
        return "models" in self.settings and "batch_sizes" in self.settings

    def section(self, name: str, device_type: str) -> dict | None:
        top = getattr(self, name)
        override = self.blocks.get(device_type, {}).get(name)
        if top is None and override is None:
            return None
        return {**(top or {}), **(override or {})}

    def fidelity_spec(self, device_type: str, overrides: dict | None = None) -> FidelitySpec:
        section = self.section("fidelity", device_type)
        if section is None:
            raise SuiteError(f"{self.path}: fidelity: missing (add a fidelity: section, e.g. "
                             "{dataset: digits, epochs: 10}, to run the fidelity study)")
        settings = self.settings_for(device_type)
        problems: Problems = []
        given = {k: v for k, v in (overrides or {}).items() if v is not None}
        section = {**section, **(_validate_fidelity(given, "override", problems) or {})}
        _check_fidelity_combination(section, "fidelity", problems)
        if problems:
            raise SuiteError([f"{self.path}: {p}" for p in problems])
        return _fidelity_spec(self, settings, section)

    def headroom_spec(self, device_type: str, overrides: dict | None = None) -> HeadroomSpec:
        problems: Problems = []
        given = {k: v for k, v in (overrides or {}).items() if v is not None}
        section = {**(self.section("headroom", device_type) or {}),
                   **(_validate_headroom(given, "override", problems) or {})}
        if problems:
            raise SuiteError([f"{self.path}: {p}" for p in problems])
        batch_sizes = self.settings_for(device_type).get("batch_sizes") or [1]
        cap = section.get("memory_cap_gb")
        spec = HeadroomSpec(
            memory_cap_bytes=int(cap * 2**30) if cap else None,
            start_batch_size=section.get("start_batch_size", min(batch_sizes)),
            max_batch_size=section.get("max_batch_size", 4096), resolution=section.get("resolution", 1),
            probe_steps=section.get("probe_steps", 2), measure=section.get("measure", True))
        if spec.start_batch_size > spec.max_batch_size:
            raise SuiteError(f"{self.path}: headroom.start_batch_size: {spec.start_batch_size} is above "
                             f"max_batch_size {spec.max_batch_size}")
        return spec

    def settings_for(self, device_type: str, overrides: dict | None = None) -> dict:
        settings = {**self.settings, **self.blocks.get(device_type, {})}
        if overrides:
            settings.update(validate_overrides(overrides, self.path))
        return settings

    def cases(self, device_type: str, overrides: dict | None = None) -> list[Case]:
        settings = self.settings_for(device_type, overrides)
        if "models" not in settings or "batch_sizes" not in settings:
            raise SuiteError(f"{self.path}: models, batch_sizes: missing (this suite has no benchmark matrix; "
                             "`amp_bench fidelity` runs its fidelity section)")
        check_distributed(settings, device_type, self.path)
        cases = expand(self, settings)
        check_duplicates(cases, self.path)
        return cases


# --------------------------------------------------------------------------- field validators
# Each takes (value, path, problems) and returns the normalised value (or None when invalid).

Problems = list[str]


def _type_name(value: Any) -> str:
    return type(value).__name__


def _int(lo: int, hi: int, what: str = "an integer") -> Callable:
    def check(value, path, problems):
        if isinstance(value, bool) or not isinstance(value, int):
            problems.append(f"{path}: expected {what} between {lo} and {hi}, got {value!r} ({_type_name(value)})")
            return None
        if not lo <= value <= hi:
            problems.append(f"{path}: expected {what} between {lo} and {hi}, got {value}")
            return None
        return value
    return check


def _number(lo_exclusive: float, hi: float) -> Callable:
    def check(value, path, problems):
        if isinstance(value, str):  # YAML 1.1 reads 1e-3 (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
            problems.append(f"{path}: expected a number, got {value!r} ({_type_name(value)})")
            return None
        if not lo_exclusive < value <= hi:
            problems.append(f"{path}: expected a number > {lo_exclusive} and <= {hi}, got {value}")
            return None
        return float(value)
    return check


def _bool(value, path, problems):
    if not isinstance(value, bool):
        problems.append(f"{path}: expected true or false, got {value!r} ({_type_name(value)})")
        return None
    return value


def _str(value, path, problems):
    if not isinstance(value, str) or not value.strip():
        problems.append(f"{path}: expected a non-empty string, got {value!r} ({_type_name(value)})")
        return None
    return value


def _choice(choices: tuple[str, ...]) -> Callable:
    def check(value, path, problems):
        if not isinstance(value, str) or value not in choices:
            hint = ""
            if isinstance(value, str):
                close = difflib.get_close_matches(value, choices, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
            problems.append(f"{path}: expected one of {', '.join(choices)}, got {value!r}{hint}")
            return None
        return value
    return check


def _axis(item_check: Callable, what: str) -> Callable:
    """A matrix axis: a single value or a non-empty list of distinct values."""
    def check(value, path, problems):
        value = list(value) if isinstance(value, tuple) else value
        items = value if isinstance(value, list) else [value]
        if isinstance(value, list) and not value:
            problems.append(f"{path}: empty list: the matrix has no cases (expected at least one {what})")
            return None
        out, seen, ok = [], {}, True
        for i, item in enumerate(items):
            item_path = f"{path}[{i}]" if isinstance(value, list) else path
            checked = item_check(item, item_path, problems)
            if checked is None:
                ok = False
                continue
            if checked in seen:
                problems.append(f"{item_path}: duplicate case: {checked!r} is already listed at {path}[{seen[checked]}]")
                ok = False
                continue
            seen[checked] = i
            out.append(checked)
        return out if ok else None
    return check


def _mapping(value, path, problems):
    if not isinstance(value, dict):
        problems.append(f"{path}: expected a mapping, got {value!r} ({_type_name(value)})")
        return None
    return value


def _check_keys(mapping: dict, allowed, path: str, problems: Problems) -> None:
    for key in mapping:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), list(allowed), n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            problems.append(f"{_join(path, str(key))}: unknown key ({hint}expected one of: {', '.join(allowed)})")


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _optimizer(value, path, problems):
    if isinstance(value, str):
        value = {"name": value}
    if _mapping(value, path, problems) is None:
        return None
    fields = {"name": _choice(OPTIMIZERS), "impl": _choice(OPTIMIZER_IMPLS), "lr": _number(0, 1e3),
              "momentum": _number(-1e-12, 1.0), "weight_decay": _number(-1e-12, 1.0)}
    _check_keys(value, fields, path, problems)
    before = len(problems)
    merged = dict(DEFAULTS["optimizer"])
    for key, check in fields.items():
        if key in value:
            merged[key] = check(value[key], _join(path, key), problems)
    if len(problems) > before:
        return None
    if merged["name"] != "sgd" and "momentum" in value:
        problems.append(f"{_join(path, 'momentum')}: only sgd takes momentum")
        return None
    return OptimizerSpec(**merged)


_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}")


def _label(value, path, problems):
    """Labels name cases and their log files: keep them to safe file-name characters."""
    if not isinstance(value, str) or not _LABEL.fullmatch(value):
        problems.append(f"{path}: expected a label of letters, digits, '.', '_', '+', '-' (at most 64, "
                        f"starting with a letter or digit), got {value!r}; set 'label' to name this model")
        return None
    return value


_MODEL_FIELDS = ("ref", "label", "config", "task", "attn_implementation", "options", "num_classes",
                 "nproc_per_node")


def _model(search_dirs: tuple[str, ...]) -> Callable:
    def check(value, path, problems):
        if isinstance(value, str):
            value = {"ref": value}
        if _mapping(value, path, problems) is None:
            return None
        _check_keys(value, _MODEL_FIELDS, path, problems)
        before = len(problems)
        if "ref" not in value:
            problems.append(f"{_join(path, 'ref')}: missing (expected a model reference such as torchvision/resnet50)")
            return None
        ref = _str(value["ref"], _join(path, "ref"), problems)
        if ref is None:
            return None
        label = _label(value.get("label", model_refs.short_name(ref)), _join(path, "label"), problems)
        config = _mapping(value.get("config", {}), _join(path, "config"), problems)
        for key in config or {}:
            if not isinstance(key, str):
                problems.append(f"{_join(path, 'config')}: keys must be attribute names, got {key!r}")
        options = _mapping(value.get("options", {}), _join(path, "options"), problems)
        task = value.get("task")
        if task is not None:
            task = _choice(model_refs.TRANSFORMERS_TASKS)(task, _join(path, "task"), problems)
        attn = value.get("attn_implementation")
        if attn is not None:
            attn = _choice(model_refs.ATTN_IMPLEMENTATIONS)(attn, _join(path, "attn_implementation"), problems)
        num_classes = value.get("num_classes")
        if num_classes is not None:
            num_classes = _int(2, 1_000_000)(num_classes, _join(path, "num_classes"), problems)
        nproc = value.get("nproc_per_node")
        if nproc is not None:
            nproc = _nproc_axis(nproc, _join(path, "nproc_per_node"), problems)
        if len(problems) > before:
            return None
        kind = model_refs.kind_of(ref)
        for key, wants in (("config", "transformers"), ("task", "transformers"),
                           ("attn_implementation", "transformers"), ("options", "python"),
                           ("num_classes", "torchvision")):
            if key in value and kind is not None and kind != wants:
                problems.append(f"{_join(path, key)}: only applies to {wants}/ models, not {ref}")
        for sub, message in model_refs.check_model(ref, config=config, task=task, search_dirs=search_dirs):
            problems.append(f"{path}{sub}: {message}")
        if len(problems) > before:
            return None
        return ModelSpec(ref=ref, label=label, config=config or {}, task=task, attn_implementation=attn,
                         options=options or {}, num_classes=num_classes,
                         nproc_per_node=tuple(nproc) if nproc else None)
    return check


def _models(search_dirs):
    item = _model(search_dirs)

    def check(value, path, problems):
        items = value if isinstance(value, list) else [value]
        if isinstance(value, list) and not value:
            problems.append(f"{path}: empty list: the matrix has no cases (expected at least one model)")
            return None
        out, labels = [], {}
        for i, entry in enumerate(items):
            item_path = f"{path}[{i}]" if isinstance(value, list) else path
            spec = item(entry, item_path, problems)
            if spec is None:
                continue
            if spec.label in labels:
                problems.append(f"{item_path}: duplicate case: label {spec.label!r} is already used by "
                                f"{labels[spec.label]} (give one a distinct 'label')")
                continue
            labels[spec.label] = item_path
            out.append(spec)
        return out if len(out) == len(items) else None
    return check


def _peak_tflops(value, path, problems):
    """A number for every precision, or a mapping precision -> number."""
    if isinstance(value, dict):
        _check_keys(value, modes.names(), path, problems)
        out = {k: _number(0, 1e6)(v, _join(path, k), problems) for k, v in value.items() if k in modes.names()}
        return None if None in out.values() else out
    number = _number(0, 1e6)(value, path, problems)
    return None if number is None else {mode: number for mode in modes.names()}


_nproc_axis = _axis(_int(1, MAX_PROCS, "a process count"), "process count")
_ENDPOINT = re.compile(r"[A-Za-z0-9_.:\[\]-]+:\d{1,5}")


def _endpoint(value, path, problems):
    if not isinstance(value, str) or not _ENDPOINT.fullmatch(value):
        problems.append(f"{path}: expected HOST:PORT of the rendezvous (node 0), got {value!r}")
        return None
    return value


def _rdzv_id(value, path, problems):
    if not isinstance(value, str) or not _LABEL.fullmatch(value):
        problems.append(f"{path}: expected a job id of letters, digits, '.', '_', '+', '-', got {value!r}")
        return None
    return value


def _optional(check: Callable) -> Callable:
    """null keeps the default (e.g. threads_per_rank: null = cpu cores / processes)."""
    return lambda value, path, problems: None if value is None else check(value, path, problems)


def _setting_fields(search_dirs: tuple[str, ...]) -> dict[str, Callable]:
    return {
        "models": _models(search_dirs),
        "batch_sizes": _axis(_int(1, MAX_BATCH_SIZE, "a batch size"), "batch size"),
        "precisions": _axis(_choice(modes.names()), "precision"),
        "image_size": _axis(_int(8, 8192, "an image size"), "image size"),
        "seq_len": _axis(_int(1, 1 << 20, "a sequence length"), "sequence length"),
        "channels_last": _axis(_bool, "layout"),
        "warmup_steps": _int(0, 100_000),
        "steps": _int(1, 1_000_000),
        "repeats": _int(1, 1000),
        "optimizer": _optimizer,
        "seed": _int(0, 2**32 - 1),
        "timeout_s": _number(0, 7 * 24 * 3600),
        "allow_emulated": _bool,
        "cudnn_benchmark": _bool,
        "peak_tflops": _peak_tflops,
        "nvml_interval_ms": _number(0.5, 60_000),
        "nproc_per_node": _nproc_axis,
        "nnodes": _int(1, MAX_PROCS, "a node count"),
        "dist_backend": _choice(DIST_BACKENDS),
        "threads_per_rank": _optional(_int(1, 4096, "a thread count")),
        "rdzv_endpoint": _optional(_endpoint),
        "rdzv_id": _optional(_rdzv_id),
    }


FIDELITY_MODELS = ("small_cnn", "tabular_transformer")


def _fidelity_model(value, path, problems):
    if _str(value, path, problems) is None:
        return None
    if value in FIDELITY_MODELS:
        return value
    if model_refs.kind_of(value) == "torchvision":
        found = model_refs.check_model(value)
        problems.extend(f"{path}{sub}: {message}" for sub, message in found)
        return None if found else value
    problems.append(f"{path}: expected {', '.join(FIDELITY_MODELS)} or torchvision/<name>, got {value!r}")
    return None


def _fidelity_fields() -> dict[str, Callable]:
    from amp_bench.datasets import DATASETS
    return {
        "dataset": _choice(DATASETS), "model": _fidelity_model, "epochs": _int(1, 100_000),
        "batch_size": _int(1, MAX_BATCH_SIZE, "a batch size"), "seeds": _axis(_int(0, 2**32 - 1, "a seed"), "seed"),
        "precisions": _axis(_choice(modes.names()), "precision"), "optimizer": _optimizer,
        "test_fraction": _number(0, 0.9), "image_size": _int(8, 1024, "an image size"),
        "tolerance_pp": _number(0, 100), "probe_every": _int(0, 10_000_000), "timeout_s": _number(0, 7 * 24 * 3600),
    }


HEADROOM_FIELDS: dict[str, Callable] = {
    "memory_cap_gb": _number(0, 1e6), "start_batch_size": _int(1, MAX_BATCH_SIZE, "a batch size"),
    "max_batch_size": _int(1, MAX_BATCH_SIZE, "a batch size"), "resolution": _int(1, MAX_BATCH_SIZE),
    "probe_steps": _int(1, 1000), "measure": _bool,
}


def _checked_fields(data: dict, path: str, problems: Problems, fields: dict[str, Callable]) -> dict:
    """Each present field through its check; the valid ones, normalised (problems collect the rest)."""
    out = {}
    for key, check in fields.items():
        if key in data:
            checked = check(data[key], _join(path, key), problems)
            if checked is not None:
                out[key] = checked
    return out


def _validate_section(value, path: str, problems: Problems, fields: dict[str, Callable]) -> dict | None:
    if _mapping(value, path, problems) is None:
        return None
    _check_keys(value, fields, path, problems)
    return _checked_fields(value, path, problems, fields)


def _validate_fidelity(value, path: str, problems: Problems) -> dict | None:
    return _validate_section(value, path, problems, _fidelity_fields())


def _validate_headroom(value, path: str, problems: Problems) -> dict | None:
    return _validate_section(value, path, problems, HEADROOM_FIELDS)


def _check_fidelity_combination(section: dict, path: str, problems: Problems) -> None:
    from amp_bench.datasets import DEFAULT_MODELS
    dataset = section.get("dataset", "digits")
    model = section.get("model", DEFAULT_MODELS[dataset])
    image_data = dataset == "digits"
    if (model == "tabular_transformer") == image_data:
        problems.append(f"{_join(path, 'model')}: {model} does not take the {dataset} dataset "
                        f"({'images' if image_data else 'tabular features'}); use {DEFAULT_MODELS[dataset]}")


def _fidelity_spec(suite: Suite, settings: dict, section: dict) -> FidelitySpec:
    from amp_bench.datasets import DEFAULT_MODELS
    dataset = section.get("dataset", "digits")
    precisions = list(section.get("precisions") or settings["precisions"])
    precisions = ["fp32"] + [p for p in precisions if p != "fp32"]  # the reference always runs, first
    optimizer = section.get("optimizer") or OptimizerSpec(name="sgd", impl="foreach", lr=0.05, momentum=0.9)
    model = section.get("model", DEFAULT_MODELS[dataset])
    return FidelitySpec(
        suite=suite.name, dataset=dataset, model=model, epochs=section.get("epochs", 10),
        batch_size=section.get("batch_size", 64), seeds=tuple(section.get("seeds") or [settings["seed"]]),
        precisions=tuple(precisions), optimizer=optimizer, test_fraction=section.get("test_fraction", 0.25),
        image_size=section.get("image_size", 32) if model.startswith("torchvision/") else None,
        tolerance_pp=section.get("tolerance_pp", 1.0), probe_every=section.get("probe_every", 0),
        timeout_s=section.get("timeout_s", settings["timeout_s"]), allow_emulated=settings["allow_emulated"])


SECTIONS = ("fidelity", "headroom")
TOP_ONLY = ("name", "description", "device") + DEVICE_BLOCKS
SETTING_KEYS = tuple(_setting_fields(()))


def _validate_settings(data: dict, path: str, problems: Problems, search_dirs) -> dict:
    return _checked_fields(data, path, problems, _setting_fields(search_dirs))


# --------------------------------------------------------------------------- loading

def _read(path: Path) -> tuple[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SuiteError(f"{path}: suite file not found") from None
    except IsADirectoryError:
        raise SuiteError(f"{path}: is a directory, expected a suite .yaml file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SuiteError(f"{path}: cannot read suite file ({exc})") from None
    try:
        return text, yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SuiteError(f"{path}{where}: invalid YAML: {problem}") from None


def load_suite(path: str | Path) -> Suite:
    """Read and validate a suite. Raises SuiteError listing every problem found."""
    path = Path(path)
    text, data = _read(path)
    problems: Problems = []
    if data is None:
        raise SuiteError(f"{path}: empty suite file (expected a mapping with at least 'models' and 'batch_sizes')")
    if not isinstance(data, dict):
        raise SuiteError(f"{path}: expected a mapping at the top level, got {_type_name(data)}")
    search_dirs = (str(path.resolve().parent),)
    _check_keys(data, SETTING_KEYS + TOP_ONLY + SECTIONS, "", problems)
    settings = {**DEFAULTS, "optimizer": OptimizerSpec()}
    settings.update(_validate_settings(data, "", problems, search_dirs))
    for required in ("models", "batch_sizes"):
        fidelity_only = "fidelity" in data or any(isinstance(data.get(b), dict) and "fidelity" in data[b]
                                                  for b in DEVICE_BLOCKS)
        if required not in data and not fidelity_only:  # a fidelity-only suite needs no matrix
            problems.append(f"{required}: missing (the matrix needs models and batch_sizes)")
    sections = {"fidelity": None, "headroom": None}
    sections["fidelity"] = _validate_fidelity(data["fidelity"], "fidelity", problems) if "fidelity" in data else None
    sections["headroom"] = _validate_headroom(data["headroom"], "headroom", problems) if "headroom" in data else None
    name = _str(data.get("name", path.stem), "name", problems)
    description = data.get("description", "")
    if not isinstance(description, str):
        problems.append(f"description: expected a string, got {_type_name(description)}")
    device = data.get("device", "auto")
    if not (isinstance(device, str) and re.fullmatch(r"auto|cpu|cuda(:\d+)?", device)):
        problems.append(f"device: expected auto, cpu, cuda or cuda:N, got {device!r}")
    blocks = {}
    for block in DEVICE_BLOCKS:
        if block in data:
            if _mapping(data[block], block, problems) is None:
                continue
            _check_keys(data[block], SETTING_KEYS + SECTIONS, block, problems)
            blocks[block] = _validate_settings(data[block], block, problems, search_dirs)
            if "fidelity" in data[block]:
                blocks[block]["fidelity"] = _validate_fidelity(data[block]["fidelity"], f"{block}.fidelity", problems)
            if "headroom" in data[block]:
                blocks[block]["headroom"] = _validate_headroom(data[block]["headroom"], f"{block}.headroom", problems)
    if problems:
        raise SuiteError([f"{path}: {p}" for p in problems])
    suite = Suite(path=path, name=name, description=description, device=device,
                  sha256=hashlib.sha256(text.encode()).hexdigest(), text=text,
                  settings=settings, blocks=blocks, **sections)
    for block in DEVICE_BLOCKS:  # every device's matrix must be sound, not just this machine's
        if suite.has_matrix:
            suite.cases(block)
        if suite.section("fidelity", block) is not None:
            suite.fidelity_spec(block)
        if suite.section("headroom", block) is not None:
            suite.headroom_spec(block)
    return suite


def validate_overrides(overrides: dict, path: Path) -> dict:
    """Command-line / API overrides go through the same checks as the file."""
    problems: Problems = []
    unknown = [k for k in overrides if k not in SETTING_KEYS]
    for key in unknown:
        problems.append(f"override {key!r}: unknown setting (expected one of: {', '.join(SETTING_KEYS)})")
    known = {k: v for k, v in overrides.items() if k in SETTING_KEYS and v is not None}
    out = _validate_settings(known, "override", problems, (str(Path(path).resolve().parent),))
    if problems:
        raise SuiteError([f"{path}: {p}" for p in problems])
    return out


def expand(suite: Suite, settings: dict) -> list[Case]:
    cases = []
    for spec in settings["models"]:
        kind = spec.kind
        image_sizes = settings["image_size"] if kind == "torchvision" else [None]
        seq_lens = settings["seq_len"] if kind == "transformers" else [None]
        layouts = settings["channels_last"] if kind != "transformers" else [False]
        procs = list(spec.nproc_per_node or settings["nproc_per_node"])
        for image_size, seq_len, batch_size, channels_last, nproc, precision in itertools.product(
                image_sizes, seq_lens, settings["batch_sizes"], layouts, procs, settings["precisions"]):
            cases.append(Case(
                suite=suite.name, model=spec, batch_size=batch_size, precision=precision,
                channels_last=channels_last, image_size=image_size, seq_len=seq_len,
                warmup_steps=settings["warmup_steps"], steps=settings["steps"], repeats=settings["repeats"],
                optimizer=settings["optimizer"], seed=settings["seed"], timeout_s=settings["timeout_s"],
                allow_emulated=settings["allow_emulated"], cudnn_benchmark=settings["cudnn_benchmark"],
                peak_tflops=(settings["peak_tflops"] or {}).get(precision),
                nvml_interval_ms=settings["nvml_interval_ms"],
                search_dirs=(str(suite.path.resolve().parent),),
                nproc_per_node=nproc, nnodes=settings["nnodes"], dist_backend=settings["dist_backend"],
                threads_per_rank=settings["threads_per_rank"], rdzv_endpoint=settings["rdzv_endpoint"],
                rdzv_id=settings["rdzv_id"]))
    return cases


def check_distributed(settings: dict, device_type: str, path: Path) -> None:
    """Settings that are fine one by one but not together."""
    where = "" if device_type not in DEVICE_BLOCKS else f" (on {device_type})"
    problems = []
    uses_ddp = any(n is not None for n in settings["nproc_per_node"]) or \
        any(m.nproc_per_node for m in settings["models"])
    if settings["nnodes"] > 1 and not uses_ddp:
        problems.append(f"nnodes: {settings['nnodes']} nodes need nproc_per_node (processes per node){where}")
    if settings["nnodes"] > 1 and not settings["rdzv_endpoint"]:
        problems.append(f"rdzv_endpoint: missing: nnodes: {settings['nnodes']} needs the HOST:PORT every node "
                        f"meets at (node 0's address){where}")
    if problems:
        raise SuiteError([f"{path}: {p}" for p in problems])


def check_duplicates(cases: list[Case], path: Path) -> None:
    seen: set[str] = set()
    dupes = []
    for case in cases:
        if case.case_id in seen:
            dupes.append(f"{path}: models: duplicate case {case.case_id!r}")
        seen.add(case.case_id)
    if dupes:
        raise SuiteError(dupes)
