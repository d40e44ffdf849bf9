"""The field tables: which keys each part of a suite file takes, and the check each value goes through.

The run settings (top level, cpu:/cuda: blocks and overrides alike), a `models:` entry, an optimizer
mapping, the `fidelity:` and `headroom:` sections, and the keys only the top level takes; with the
limits and choices they check against. Defaults are not here: they are in schema.DEFAULTS.

The precision list is amp_bench.modes', read when a check is built, never copied at import. Model
references are checked through amp_bench.measure.models, imported at call time because it imports torch.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from amp_bench import modes
from amp_bench.errors import SuiteError
from amp_bench.suite import checks, schema
from amp_bench.suite.checks import Problems

MAX_BATCH_SIZE = 65536
OPTIMIZERS = ("sgd", "adam", "adamw")
OPTIMIZER_IMPLS = ("for-loop", "foreach", "fused")
DEVICE_BLOCKS = ("cpu", "cuda")
DIST_BACKENDS = ("auto", "gloo", "nccl")
MAX_PROCS = 1024
FIDELITY_MODELS = ("small_cnn", "tabular_transformer", "mlp")


# --------------------------------------------------------------------------- optimizer

OPTIMIZER_FIELDS: dict[str, Callable] = {
    "name": checks.choice(OPTIMIZERS), "impl": checks.choice(OPTIMIZER_IMPLS), "lr": checks.number(0, 1e3),
    "momentum": checks.number(-1e-12, 1.0), "weight_decay": checks.number(-1e-12, 1.0),
}


def _optimizer(value, path, problems):
    """A name (`optimizer: adamw`) or a mapping; the keys it leaves out come from schema.DEFAULTS["optimizer"]."""
    if isinstance(value, str):
        value = {"name": value}
    if checks.mapping(value, path, problems) is None:
        return None
    checks.check_keys(value, OPTIMIZER_FIELDS, path, problems)
    before = len(problems)
    merged = dict(schema.DEFAULTS["optimizer"])
    for key, check in OPTIMIZER_FIELDS.items():
        if key in value:
            merged[key] = check(value[key], checks.join(path, key), problems)
    if len(problems) > before:
        return None
    if merged["name"] != "sgd" and "momentum" in value:
        problems.append(f"{checks.join(path, 'momentum')}: only sgd takes momentum")
        return None
    return schema.OptimizerSpec(**merged)


def _compile_item(value, path, problems):
    """false / true / a torch.compile mode ("false" and "eager" are accepted from the command line)."""
    if isinstance(value, bool) or value in ("false", "true", schema.EAGER):
        return schema.compile_mode_name(True if value == "true" else value)
    return checks.choice(schema.COMPILE_MODES)(value, path, problems)


_compile_axis = checks.axis(_compile_item, f"compile mode (false, true or one of {', '.join(schema.COMPILE_MODES)})")
COMPILE_BACKENDS = ("inductor", "aot_eager", "eager", "cudagraphs")  # "eager": dynamo only, no codegen (tests)
COMPILE_CACHES = ("warm", "cold")
ISOLATIONS = ("fork", "spawn")  # a case's worker: a child of the run's fork server, or a fresh interpreter
ON_CONTENTION, CPU_ALLOCATORS = ("stop", "flag"), ("keep", "system")


# --------------------------------------------------------------------------- models: entries

_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}")


# labels name cases and their log files: safe file-name characters only
_label = checks.matching(_LABEL, "a label of letters, digits, '.', '_', '+', '-' (at most 64, starting with a "
                         "letter or digit)", "; set 'label' to name this model")


_MODEL_FIELDS = ("ref", "label", "config", "task", "attn_implementation", "options", "num_classes",
                 "nproc_per_node", "compile", "precisions", "explain")
_nproc_axis = checks.axis(checks.integer(1, MAX_PROCS, "a process count"), "process count")


# per-model keys whose null (or absence) means "the suite's own": key -> its check
_MODEL_OVERRIDES: dict[str, Callable] = {
    "nproc_per_node": _nproc_axis, "compile": _compile_axis,
    "precisions": lambda v, p, problems: checks.axis(checks.choice(modes.names()), "precision")(v, p, problems),
    "explain": checks.boolean,
}
_KIND_ONLY = (("config", "transformers"), ("task", "transformers"), ("attn_implementation", "transformers"),
              ("options", "python"), ("num_classes", "torchvision"))


def _model_overrides(value: dict, path: str, problems: Problems) -> dict:
    out = {}
    for key, check in _MODEL_OVERRIDES.items():
        given = value.get(key, schema.DEFAULTS["model"][key])
        checked = check(given, checks.join(path, key), problems) if given is not None else None
        out[key] = tuple(checked) if isinstance(checked, list) else checked
    return out


def _model(search_dirs: tuple[str, ...]) -> Callable:
    def check(value, path, problems):
        from amp_bench.suite import model_refs
        defaults = schema.DEFAULTS["model"]
        if isinstance(value, str):
            value = {"ref": value}
        if checks.mapping(value, path, problems) is None:
            return None
        checks.check_keys(value, _MODEL_FIELDS, path, problems)
        before = len(problems)
        if "ref" not in value:
            problems.append(f"{checks.join(path, 'ref')}: missing "
                            "(expected a model reference such as torchvision/resnet50)")
            return None
        ref = checks.text(value["ref"], checks.join(path, "ref"), problems)
        if ref is None:
            return None
        label = _label(value.get("label", model_refs.short_name(ref)), checks.join(path, "label"), problems)
        config = checks.mapping(value.get("config", defaults["config"]), checks.join(path, "config"), problems)
        for key in config or {}:
            if not isinstance(key, str):
                problems.append(f"{checks.join(path, 'config')}: keys must be attribute names, got {key!r}")
        options = checks.mapping(value.get("options", defaults["options"]), checks.join(path, "options"), problems)
        def nullable(key: str, check: Callable):  # null is the same as leaving the key out
            return checks.optional(check)(value.get(key, defaults[key]), checks.join(path, key), problems)
        task = nullable("task", checks.choice(model_refs.TRANSFORMERS_TASKS))
        attn = nullable("attn_implementation", checks.choice(model_refs.ATTN_IMPLEMENTATIONS))
        num_classes = nullable("num_classes", checks.integer(2, 1_000_000))
        overrides = _model_overrides(value, path, problems)
        if len(problems) > before:
            return None
        kind = model_refs.kind_of(ref)
        for key, wants in _KIND_ONLY:
            if key in value and kind is not None and kind != wants:
                problems.append(f"{checks.join(path, key)}: only applies to {wants}/ models, not {ref}")
        for sub, message in model_refs.check_model(ref, config=config, task=task, search_dirs=search_dirs):
            problems.append(f"{path}{sub}: {message}")
        if len(problems) > before:
            return None
        return schema.ModelSpec(ref=ref, label=label, config=config or {}, task=task, attn_implementation=attn,
                                options=options or {}, num_classes=num_classes, **overrides)
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


# --------------------------------------------------------------------------- run settings

def _peak_tflops(value, path, problems):
    """A number for every precision, or a mapping precision -> number."""
    if isinstance(value, dict):
        checks.check_keys(value, modes.names(), path, problems)
        out = {k: checks.number(0, 1e6)(v, checks.join(path, k), problems)
               for k, v in value.items() if k in modes.names()}
        return None if None in out.values() else out
    number = checks.number(0, 1e6)(value, path, problems)
    return None if number is None else {mode: number for mode in modes.names()}


_endpoint = checks.matching(re.compile(r"[A-Za-z0-9_.:\[\]-]+:\d{1,5}"), "HOST:PORT of the rendezvous (node 0)")
_rdzv_id = checks.matching(_LABEL, "a job id of letters, digits, '.', '_', '+', '-'")


def _setting_fields(search_dirs: tuple[str, ...]) -> dict[str, Callable]:
    """Built per use: models resolve python: references against the suite's folder."""
    return {
        "models": _models(search_dirs),
        "batch_sizes": checks.axis(checks.integer(1, MAX_BATCH_SIZE, "a batch size"), "batch size"),
        "precisions": checks.axis(checks.choice(modes.names()), "precision"),
        "image_size": checks.axis(checks.integer(8, 8192, "an image size"), "image size"),
        "seq_len": checks.axis(checks.integer(1, 1 << 20, "a sequence length"), "sequence length"),
        "channels_last": checks.axis(checks.boolean, "layout"),
        "warmup_steps": checks.integer(0, 100_000),
        "steps": checks.integer(1, 1_000_000),
        "target_ci": checks.optional(checks.number(0, 0.5)),
        "min_steps": checks.integer(1, 1_000_000),
        "max_steps": checks.integer(1, 1_000_000),
        "case_budget_s": checks.optional(checks.number(0, 7 * 24 * 3600)),
        "budget_s": checks.optional(checks.number(0, 30 * 24 * 3600)),
        "repeats": checks.integer(1, 1000),
        "repeats_per_worker": checks.integer(1, 1000),
        "optimizer": _optimizer,
        "seed": checks.integer(0, 2**32 - 1),
        "timeout_s": checks.number(0, 7 * 24 * 3600),
        "allow_emulated": checks.boolean,
        "cudnn_benchmark": checks.boolean,
        "peak_tflops": _peak_tflops,
        "nvml_interval_ms": checks.number(0.5, 60_000),
        "nproc_per_node": _nproc_axis,
        "nnodes": checks.integer(1, MAX_PROCS, "a node count"),
        "dist_backend": checks.choice(DIST_BACKENDS),
        "threads_per_rank": checks.optional(checks.integer(1, 4096, "a thread count")),
        "rdzv_endpoint": checks.optional(_endpoint),
        "rdzv_id": checks.optional(_rdzv_id),
        "compile": _compile_axis,
        "compile_backend": checks.choice(COMPILE_BACKENDS),
        "compile_fullgraph": checks.boolean,
        "compile_optimizer": checks.boolean,
        "explain": checks.boolean,
        "isolation": checks.choice(ISOLATIONS),
        "on_contention": checks.choice(ON_CONTENTION),
        "interleave": checks.choice(("auto", "steps", "repeats")),
        "cpu_allocator": checks.choice(CPU_ALLOCATORS),
        "compile_cache": checks.choice(COMPILE_CACHES),
        "compile_precisions": checks.optional(checks.axis(checks.choice(modes.names()), "precision")),
        "compile_timeout_s": checks.optional(checks.number(0, 7 * 24 * 3600)),
        "fp8_recipe": checks.choice(schema.FP8_RECIPES),
        "fp8_skip_first_last": checks.boolean,
        "fp8_compile": checks.boolean,
    }


SECTIONS = ("fidelity", "headroom")
TOP_ONLY = ("name", "description", "device", "executor", "predict") + DEVICE_BLOCKS
SETTING_KEYS = tuple(_setting_fields(()))


def validate_settings(data: dict, path: str, problems: Problems, search_dirs) -> dict:
    return checks.checked_fields(data, path, problems, _setting_fields(search_dirs))


# --------------------------------------------------------------------------- fidelity: and headroom:

def _fidelity_model(value, path, problems):
    if checks.text(value, path, problems) is None:
        return None
    if value in FIDELITY_MODELS:
        return value
    from amp_bench.suite import model_refs
    if model_refs.kind_of(value) == "torchvision":
        found = model_refs.check_model(value)
        problems.extend(f"{path}{sub}: {message}" for sub, message in found)
        return None if found else value
    problems.append(f"{path}: expected {', '.join(FIDELITY_MODELS)} or torchvision/<name>, got {value!r}")
    return None


def _fidelity_fields() -> dict[str, Callable]:
    return {
        "dataset": checks.choice(schema.DATASETS), "model": _fidelity_model, "epochs": checks.integer(1, 100_000),
        "batch_size": checks.integer(1, MAX_BATCH_SIZE, "a batch size"),
        "seeds": checks.axis(checks.integer(0, 2**32 - 1, "a seed"), "seed"),
        "precisions": checks.axis(checks.choice(modes.names()), "precision"), "optimizer": _optimizer,
        "test_fraction": checks.number(0, 0.9), "image_size": checks.integer(8, 1024, "an image size"),
        "tolerance_pp": checks.number(0, 100), "probe_every": checks.integer(0, 10_000_000),
        "timeout_s": checks.number(0, 7 * 24 * 3600),
        "compile": _compile_item,  # one mode: the study trains every precision eager or compiled
    }


HEADROOM_FIELDS: dict[str, Callable] = {
    "memory_cap_gb": checks.number(0, 1e6), "start_batch_size": checks.integer(1, MAX_BATCH_SIZE, "a batch size"),
    "max_batch_size": checks.integer(1, MAX_BATCH_SIZE, "a batch size"),
    "resolution": checks.integer(1, MAX_BATCH_SIZE), "probe_steps": checks.integer(1, 1000), "measure": checks.boolean,
}


# --------------------------------------------------------------------------- predict: other GPUs (analysis/predict/)
# The GPU names are keys of amp_bench/platform/gpu_specs.py's table, which this layer may not import:
# their form is checked here, the names themselves where the table is (analysis/predict/settings.py).
_gpu_key = checks.matching(re.compile(r"[a-z0-9][a-z0-9-]{0,39}"),
                           "a GPU key such as h100-sxm (python -m amp_bench predict RUN --list-targets)")


PREDICT_FIELDS: dict[str, Callable] = {"targets": checks.axis(_gpu_key, "GPU"),
                                       "fp32_as": checks.choice(("mode", "pytorch-default"))}


def validate_predict(value, path: str, problems: Problems) -> dict | None:
    return checks.validate_section(value, path, problems, PREDICT_FIELDS)


def validate_fidelity(value, path: str, problems: Problems) -> dict | None:
    return checks.validate_section(value, path, problems, _fidelity_fields())


def validate_headroom(value, path: str, problems: Problems) -> dict | None:
    return checks.validate_section(value, path, problems, HEADROOM_FIELDS)


def fidelity_dataset_and_model(section: dict) -> tuple[str, str]:
    """A validated fidelity section's dataset and model, defaults filled in (the model follows the dataset)."""
    dataset = section.get("dataset", schema.DEFAULTS["fidelity"]["dataset"])
    return dataset, section.get("model") or schema.DEFAULT_MODELS[dataset]


def check_fidelity_combination(section: dict, path: str, problems: Problems) -> None:
    dataset, model = fidelity_dataset_and_model(section)
    image_data = dataset == "digits"
    takes = {"tabular_transformer": (False,), "mlp": (True, False)}.get(model, (True,))  # image data?
    if image_data not in takes:
        problems.append(f"{checks.join(path, 'model')}: {model} does not take the {dataset} dataset "
                        f"({'images' if image_data else 'tabular features'}); use {schema.DEFAULT_MODELS[dataset]}")


def validate_overrides(overrides: dict, path: Path) -> dict:
    """Command-line / API overrides go through the same checks as the file."""
    problems: Problems = [f"override {key!r}: unknown setting (expected one of: {', '.join(SETTING_KEYS)})"
                          for key in overrides if key not in SETTING_KEYS]
    known = {k: v for k, v in overrides.items() if k in SETTING_KEYS and v is not None}
    out = validate_settings(known, "override", problems, (str(Path(path).resolve().parent),))
    if problems:
        raise SuiteError([f"{path}: {p}" for p in problems])
    return out
