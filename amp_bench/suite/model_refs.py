"""Model references, checked without importing torch, torchvision or transformers.

Three kinds of reference:
  torchvision/<name>            any torchvision classification model, weights=None
  transformers/<model_type>     built from a config object (never the hub)
  python:<module>:<callable>    the user's own: callable(**options) -> (model, make_batch, loss_fn)

`run` and `validate` check every name before a worker starts, and importing torchvision and
transformers only to list their names costs the parent 3-4 s. Neither library offers its registry
without importing itself, so the names are read here from their installed sources: torchvision's
`@register_model()` functions in the modules directly under torchvision/models (what
`torchvision.models.list_models(module=torchvision.models)` returns) and transformers' auto-model
mapping tables (literal tables in models/auto/modeling_auto.py). When a source does not parse as
expected (a future layout), the library is imported after all: slower, never wrong. A config
override is checked against the config class, which does import transformers: only suites that
carry `config:` pay for it, and only for a key the config's source does not declare. A user's
`python:` module is read the same way: a top-level `def` or `class` of that name is found without
running the module (which imports torch: 1.7 s); anything else imports it. The worker builds the
model (amp_bench.measure.models), and a module that fails only when run fails there, in its row.
"""
from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path

TRANSFORMERS_TASKS = ("masked-lm", "causal-lm", "sequence-classification")
ATTN_IMPLEMENTATIONS = ("sdpa", "eager", "flash_attention_2", "flash_attention_3", "flex_attention")
_TASK_TABLES = {"sequence-classification": "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
                "causal-lm": "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "masked-lm": "MODEL_FOR_MASKED_LM_MAPPING_NAMES"}


def kind_of(ref: str) -> str | None:
    if ref.startswith("torchvision/"):
        return "torchvision"
    if ref.startswith("transformers/"):
        return "transformers"
    if ref.startswith("python:"):
        return "python"
    return None


def short_name(ref: str) -> str:
    return ref.rsplit(":", 1)[-1] if ref.startswith("python:") else ref.split("/", 1)[-1]


def _package_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)  # finds, does not import
    return Path(spec.origin).parent if spec is not None and spec.origin else None


@functools.lru_cache(maxsize=1)
def torchvision_names() -> list[str]:
    root = _package_dir("torchvision")
    names = []
    if root is not None:
        for path in sorted((root / "models").glob("*.py")):
            try:
                tree = ast.parse(path.read_text(encoding="utf-8"))
            except (OSError, SyntaxError, ValueError):
                names = []
                break
            for node in tree.body:
                if isinstance(node, ast.FunctionDef) and any(
                        isinstance(d, ast.Call) and getattr(d.func, "id", None) == "register_model"
                        for d in node.decorator_list):
                    names.append(node.name)
    if len(names) < 10:  # not the layout this reader knows: ask the library
        import torchvision.models
        return sorted(torchvision.models.list_models(module=torchvision.models))
    return sorted(names)


@functools.lru_cache(maxsize=1)
def _task_tables() -> dict[str, dict[str, str]]:
    """task -> {model_type: head class name}."""
    root = _package_dir("transformers")
    tables: dict[str, dict[str, str]] = {}
    try:
        tree = ast.parse((root / "models" / "auto" / "modeling_auto.py").read_text(encoding="utf-8"))
        wanted = {v: k for k, v in _TASK_TABLES.items()}
        for node in tree.body:
            if (isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
                    and node.targets[0].id in wanted and isinstance(node.value, ast.Call) and node.value.args):
                tables[wanted[node.targets[0].id]] = dict(ast.literal_eval(node.value.args[0]))
    except (OSError, SyntaxError, ValueError, TypeError, AttributeError):
        tables = {}
    if set(tables) != set(_TASK_TABLES) or not all(tables.values()):
        from transformers.models.auto import modeling_auto as auto
        tables = {task: dict(getattr(auto, name)) for task, name in _TASK_TABLES.items()}
    return tables


def transformers_types() -> dict[str, str]:
    """model_type -> default task, for every model type with a head we can train."""
    tables = _task_tables()  # a type in several tables: later wins (masked-lm > causal-lm > sequence-classification)
    return {name: task for task in ("sequence-classification", "causal-lm", "masked-lm") for name in tables[task]}


def import_callable(ref: str, search_dirs: tuple[str, ...] = ()) -> Callable:
    """'python:pkg.module:func' -> func. Raises ValueError with a one-line reason."""
    module_name, attr = _split_python_ref(ref)
    _add_search_dirs(search_dirs)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise ValueError(f"cannot import module {module_name!r} ({type(exc).__name__}: {exc})") from None
    func = getattr(module, attr, None)
    if not callable(func):
        raise ValueError(f"module {module_name!r} has no callable {attr!r}")
    return func


def _add_search_dirs(search_dirs: tuple[str, ...]) -> None:
    """The suite's folder (and the caller's) first on sys.path, where a `python:` module is found."""
    for directory in search_dirs:
        if directory not in sys.path:
            sys.path.insert(0, directory)


def _split_python_ref(ref: str) -> tuple[str, str]:
    parts = ref[len("python:"):].split(":")
    if len(parts) != 2 or not all(parts):
        raise ValueError(f"expected python:<module>:<callable>, got {ref!r}")
    return parts[0], parts[1]


def _defined_in_source(module_name: str, attr: str, search_dirs: tuple[str, ...]) -> bool:
    """Does the module's source define `attr` as a top-level function or class? Read, not run. False
    means "not seen" (a name bound otherwise, a package, a compiled module): the caller imports it."""
    if "." in module_name:
        return False  # finding a submodule imports its package: no saving
    _add_search_dirs(search_dirs)
    try:
        spec = importlib.util.find_spec(module_name)
    except (ImportError, ValueError):
        return False
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return False
    try:
        tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return False  # the import says why, in its own words
    return any(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == attr
               for node in tree.body)


def _declared_config_keys(model_type: str) -> frozenset[str]:
    """The keys a transformers config class declares in its source (transformers 5: annotated class
    fields and attribute_map aliases), for models/<type>/configuration_<type>.py. Empty when the
    layout is another: the caller asks the config class itself."""
    root = _package_dir("transformers")
    module = model_type.replace("-", "_")
    path = root / "models" / module / f"configuration_{module}.py" if root else None
    try:
        tree = ast.parse(path.read_text(encoding="utf-8")) if path else None
    except (OSError, SyntaxError, ValueError):
        return frozenset()
    keys: set[str] = set()
    for node in tree.body if tree else []:
        if not isinstance(node, ast.ClassDef):
            continue
        declares_type = any(isinstance(item, ast.Assign) and getattr(item.targets[0], "id", None) == "model_type"
                            and getattr(item.value, "value", None) == model_type for item in node.body)
        if not declares_type:
            continue
        for item in node.body:
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                keys.add(item.target.id)
            elif (isinstance(item, ast.Assign) and getattr(item.targets[0], "id", None) == "attribute_map"
                  and isinstance(item.value, ast.Dict)):
                keys.update(k.value for k in item.value.keys if isinstance(k, ast.Constant))
    return frozenset(keys)


def check_model(ref: str, *, config: dict | None = None, task: str | None = None,
                search_dirs: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    """Problems with a model reference as (sub-path, message); empty when it resolves."""
    kind = kind_of(ref)
    if kind is None:
        return [("", f"unknown model reference {ref!r} (expected torchvision/<name>, "
                     "transformers/<model_type> or python:<module>:<callable>)")]
    name = ref.split("/", 1)[-1]
    if kind == "torchvision":
        names = torchvision_names()
        if name not in names:
            return [("", f"unknown torchvision model {name!r}{_did_you_mean(name, names)}; "
                         "see `python -m amp_bench list-models`")]
        return []
    if kind == "transformers":
        types = transformers_types()
        if name not in types:
            return [("", f"unknown transformers model_type {name!r}{_did_you_mean(name, list(types))}; "
                         "see `python -m amp_bench list-models`")]
        problems = []
        if task is not None and name not in _task_tables()[task]:
            problems.append((".task", f"transformers/{name} has no {task} head"))
        if config and not set(config) <= _declared_config_keys(name):
            from transformers import AutoConfig
            defaults = AutoConfig.for_model(name)
            problems += [(f".config.{key}", f"not an attribute of {type(defaults).__name__}") for key in config
                         if not hasattr(defaults, key)]
        return problems
    try:
        if not _defined_in_source(*_split_python_ref(ref), search_dirs):
            import_callable(ref, search_dirs)
    except ValueError as exc:
        return [("", str(exc))]
    return []


def _did_you_mean(word: str, choices: list[str]) -> str:
    import difflib
    close = difflib.get_close_matches(word, choices, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


# what every training worker imports whatever its model: torch, torch._dynamo (torch.optim's optimizer
# constructor imports it, 1.7 s), torchao's float8 (when installed) and amp_bench's measuring modules
_WORKER_MODULES = ("torch", "torch._dynamo", "torch.optim", "amp_bench.measure.case", "amp_bench.measure.step",
                   "amp_bench.measure.models", "amp_bench.measure.window", "amp_bench.measure.precision",
                   "amp_bench.measure.telemetry.flops", "amp_bench.measure.telemetry.phase_memory")


def preload_modules(refs, search_dirs: tuple[str, ...] = ()) -> list[str]:
    """The modules a worker for these model references imports before its first step: what a fork
    server imports once (launchers/forkserver.py) so each case's worker starts without them. Names
    only: nothing is imported here. A transformers model type adds its own modeling module (its
    package's __init__ is lazy); a name that does not import is skipped there, and the worker imports
    what it needs itself."""
    names = list(_WORKER_MODULES)
    for ref in dict.fromkeys(refs):
        kind = kind_of(ref)
        if kind == "torchvision":
            names.append("torchvision.models")
        elif kind == "transformers":
            module = short_name(ref).replace("-", "_")
            names += ["transformers", f"transformers.models.{module}.modeling_{module}"]
        elif kind == "python":
            names.append(_split_python_ref(ref)[0])
    return list(dict.fromkeys(names))
