"""Model references -> a workload: the model, an input-batch factory and a loss function.

Three kinds of reference:
  torchvision/<name>            any torchvision classification model, weights=None
  transformers/<model_type>     built from a config object (never the hub)
  python:<module>:<callable>    the user's own: callable(**options) -> (model, make_batch, loss_fn)
where make_batch(batch_size, device) -> (inputs, target) and loss_fn(output, target) -> scalar loss.
Inputs are synthetic and created once on the device.
"""
from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from typing import Any, Callable

import torch

TRANSFORMERS_TASKS = ("masked-lm", "causal-lm", "sequence-classification")
ATTN_IMPLEMENTATIONS = ("sdpa", "eager", "flash_attention_2", "flash_attention_3", "flex_attention")


@dataclass
class Workload:
    model: torch.nn.Module
    make_batch: Callable[[int, torch.device], tuple[Any, Any]]
    loss_fn: Callable[[Any, Any], torch.Tensor]
    details: dict  # recorded with the result (e.g. the attention implementation really used)


def kind_of(ref: str) -> str | None:
    if ref.startswith("torchvision/"):
        return "torchvision"
    if ref.startswith("transformers/"):
        return "transformers"
    if ref.startswith("python:"):
        return "python"
    return None


def short_name(ref: str) -> str:
    if ref.startswith("python:"):
        return ref.rsplit(":", 1)[-1]
    return ref.split("/", 1)[-1]


def torchvision_names() -> list[str]:
    import torchvision.models
    return list(torchvision.models.list_models(module=torchvision.models))


def transformers_types() -> dict[str, str]:
    """model_type -> default task, for every model type with a head we can train."""
    from transformers.models.auto import modeling_auto as auto
    types: dict[str, str] = {}
    for task, names in (("sequence-classification", auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES),
                        ("causal-lm", auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES),
                        ("masked-lm", auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES)):
        for name in names:
            types[name] = task  # later wins: masked-lm > causal-lm > sequence-classification
    return types


def _transformers_task_names(task: str) -> dict:
    from transformers.models.auto import modeling_auto as auto
    return {"masked-lm": auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES,
            "causal-lm": auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
            "sequence-classification": auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES}[task]


def import_callable(ref: str, search_dirs: tuple[str, ...] = ()) -> Callable:
    """'python:pkg.module:func' -> func. Raises ValueError with a one-line reason."""
    parts = ref[len("python:"):].split(":")
    if len(parts) != 2 or not all(parts):
        raise ValueError(f"expected python:<module>:<callable>, got {ref!r}")
    module_name, attr = parts
    for directory in search_dirs:
        if directory not in sys.path:
            sys.path.insert(0, directory)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise ValueError(f"cannot import module {module_name!r} ({type(exc).__name__}: {exc})") from None
    func = getattr(module, attr, None)
    if not callable(func):
        raise ValueError(f"module {module_name!r} has no callable {attr!r}")
    return func


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
        if task is not None and name not in _transformers_task_names(task):
            problems.append((".task", f"transformers/{name} has no {task} head"))
        from transformers import AutoConfig
        defaults = AutoConfig.for_model(name)
        for key in config or {}:
            if not hasattr(defaults, key):
                problems.append((f".config.{key}", f"not an attribute of {type(defaults).__name__}"))
        return problems
    try:
        import_callable(ref, search_dirs)
    except ValueError as exc:
        return [("", str(exc))]
    return []


def _did_you_mean(word: str, choices: list[str]) -> str:
    import difflib
    close = difflib.get_close_matches(word, choices, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _first_tensor_or_logits(output):
    # inception_v3 / googlenet return named tuples in train mode; HF models return ModelOutput.
    return getattr(output, "logits", output)


def _classification_workload(model: torch.nn.Module, image_size: int, num_classes: int,
                             channels_last: bool) -> Workload:
    def make_batch(batch_size: int, device: torch.device):
        images = torch.randn(batch_size, 3, image_size, image_size, device=device)
        if channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        labels = torch.randint(0, num_classes, (batch_size,), device=device)
        return images, labels

    def loss_fn(output, labels):
        return torch.nn.functional.cross_entropy(_first_tensor_or_logits(output), labels)

    return Workload(model, make_batch, loss_fn, {})


def build_workload(spec: dict, *, image_size: int | None, seq_len: int | None, channels_last: bool,
                   search_dirs: tuple[str, ...] = ()) -> Workload:
    """Build the model described by a case's model spec (a dict, see suite.ModelSpec.to_json)."""
    ref = spec["ref"]
    kind = kind_of(ref)
    if kind == "torchvision":
        import torchvision.models
        num_classes = spec.get("num_classes") or 1000
        model = torchvision.models.get_model(ref.split("/", 1)[1], weights=None, num_classes=num_classes)
        workload = _classification_workload(model, image_size or 224, num_classes, channels_last)
    elif kind == "transformers":
        workload = _transformers_workload(spec, seq_len or 128)
    elif kind == "python":
        builder = import_callable(ref, search_dirs)
        built = builder(**(spec.get("options") or {}))
        if not (isinstance(built, tuple) and len(built) == 3):
            raise TypeError(f"{ref} must return (model, make_batch, loss_fn), got {type(built).__name__}")
        model, make_batch, loss_fn = built
        workload = Workload(model, make_batch, loss_fn, {})
    else:
        raise ValueError(f"unknown model reference {ref!r}")
    if channels_last:
        workload.model = workload.model.to(memory_format=torch.channels_last)
    return workload


def _transformers_workload(spec: dict, seq_len: int) -> Workload:
    import transformers
    model_type = spec["ref"].split("/", 1)[1]
    task = spec.get("task") or transformers_types()[model_type]
    config = transformers.AutoConfig.for_model(model_type, **(spec.get("config") or {}))
    if task == "sequence-classification" and getattr(config, "pad_token_id", None) is None:
        config.pad_token_id = 0  # causal models refuse batch > 1 classification without one
    auto_class = {"masked-lm": transformers.AutoModelForMaskedLM,
                  "causal-lm": transformers.AutoModelForCausalLM,
                  "sequence-classification": transformers.AutoModelForSequenceClassification}[task]
    attn = spec.get("attn_implementation") or "sdpa"
    model = auto_class.from_config(config, attn_implementation=attn)
    vocab = int(config.vocab_size)
    num_labels = int(getattr(config, "num_labels", 2))

    def make_batch(batch_size: int, device: torch.device):
        input_ids = torch.randint(0, vocab, (batch_size, seq_len), device=device)
        if task == "sequence-classification":
            labels = torch.randint(0, num_labels, (batch_size,), device=device)
        else:
            labels = input_ids.clone()
        return {"input_ids": input_ids, "labels": labels}, None

    def loss_fn(output, _target):
        return output.loss

    details = {"attn_implementation": getattr(model.config, "_attn_implementation", attn), "task": task}
    return Workload(model, make_batch, loss_fn, details)


def forward(model: torch.nn.Module, inputs):
    if isinstance(inputs, dict):
        return model(**inputs)
    if isinstance(inputs, (tuple, list)):
        return model(*inputs)
    return model(inputs)
