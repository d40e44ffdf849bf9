"""Model references -> a workload: the model, an input-batch factory and a loss function.

Three kinds of reference:
  torchvision/<name>            any torchvision classification model, weights=None
  transformers/<model_type>     built from a config object (never the hub)
  python:<module>:<callable>    the user's own: callable(**options) -> (model, make_batch, loss_fn)
where make_batch(batch_size, device) -> (inputs, target) and loss_fn(output, target) -> scalar loss.
Inputs are synthetic and created once on the device. Names are checked (without importing the
libraries) in amp_bench.suite.model_refs.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from amp_bench.suite.model_refs import import_callable, kind_of, transformers_types


@dataclass
class Workload:
    model: torch.nn.Module
    make_batch: Callable[[int, torch.device], tuple[Any, Any]]
    loss_fn: Callable[[Any, Any], torch.Tensor]
    details: dict  # recorded with the result (e.g. the attention implementation really used)


def _classification_workload(model: torch.nn.Module, image_size: int, num_classes: int,
                             channels_last: bool) -> Workload:
    def make_batch(batch_size: int, device: torch.device):
        images = torch.randn(batch_size, 3, image_size, image_size, device=device)
        if channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        labels = torch.randint(0, num_classes, (batch_size,), device=device)
        return images, labels

    def loss_fn(output, labels):
        # inception_v3 / googlenet return named tuples in train mode; HF models return ModelOutput.
        return torch.nn.functional.cross_entropy(getattr(output, "logits", output), labels)

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
    auto_class = {"masked-lm": transformers.AutoModelForMaskedLM, "causal-lm": transformers.AutoModelForCausalLM,
                  "sequence-classification": transformers.AutoModelForSequenceClassification}[task]
    attn = spec.get("attn_implementation") or "sdpa"
    vocab = int(config.vocab_size)  # the tokens the batch draws from, padded or not
    pad = spec.get("pad_vocab_to_multiple_of")
    if pad:  # nanoGPT's padding (50257 -> 50304): the extra rows of the embedding and lm_head are never a target
        config.vocab_size = -(-vocab // int(pad)) * int(pad)
    model = auto_class.from_config(config, attn_implementation=attn)
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

    details = {"attn_implementation": getattr(model.config, "_attn_implementation", attn), "task": task,
               "vocab_size": int(config.vocab_size)}
    return Workload(model, make_batch, loss_fn, details)


def forward(model: torch.nn.Module, inputs):
    if isinstance(inputs, dict):
        return model(**inputs)
    return model(*inputs) if isinstance(inputs, (tuple, list)) else model(inputs)
