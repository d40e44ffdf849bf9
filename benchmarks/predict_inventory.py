"""Op inventories of whole training steps at the published batch sizes, for scoring `predict`'s op-inventory
path against the public AMP tables (benchmarks/predict_amp.py), with no GPU and no real compute.

The published workloads (HF BERT with a SQuAD or pretraining head, torchvision's ResNet-50 with SGD) are
built here; each step is recorded on fake tensors by the recorder `predict SUITE` uses for a suite's
cases (amp_bench/measure/fake_step.py: CUDA autocast's policy, GradScaler's kernels, the Chrome-trace
events predict reads), at a batch no 2-core CPU could train.

    python benchmarks/predict_inventory.py resnet50 256 amp_fp16 --channels-last -o out.json.gz
"""
from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from amp_bench import modes
from amp_bench.measure.fake_step import record_step


def build(model: str, batch: int, channels_last: bool):
    """(module, inputs, loss_fn, optimizer class and kwargs) of a workload the public tables hold."""
    if model == "resnet50":
        import torchvision
        net = torchvision.models.resnet50()
        x = torch.randn(batch, 3, 224, 224)
        if channels_last:  # Module.to(memory_format=) cannot swap fake parameters: restride them in place
            for param in net.parameters():
                if param.dim() == 4:
                    param.data = param.data.contiguous(memory_format=torch.channels_last)
            x = x.contiguous(memory_format=torch.channels_last)
        y = torch.randint(0, 1000, (batch,))
        return net, x, lambda out: torch.nn.functional.cross_entropy(out, y), torch.optim.SGD, \
            {"lr": 0.1, "momentum": 0.9, "foreach": True}
    from transformers import BertConfig, BertForPreTraining, BertForQuestionAnswering
    large = "large" in model
    config = BertConfig(vocab_size=30528, hidden_size=1024 if large else 768, num_hidden_layers=24 if large else 12,
                        num_attention_heads=16 if large else 12, intermediate_size=4096 if large else 3072,
                        attn_implementation="eager")
    seq = int(model.rsplit("_", 1)[1]) if model.startswith("bert_large_pretrain") else 384
    ids = torch.randint(0, 30522, (batch, seq))
    if model.startswith("bert_large_pretrain"):
        net = BertForPreTraining(config)
        labels, nsp = torch.randint(0, 30522, (batch, seq)), torch.randint(0, 2, (batch,))
        return net, ids, lambda out: _pretrain_loss(out, labels, nsp), torch.optim.AdamW, {"foreach": True}
    net = BertForQuestionAnswering(config)
    start, end = torch.randint(0, seq, (batch,)), torch.randint(0, seq, (batch,))
    loss = lambda out: (torch.nn.functional.cross_entropy(out.start_logits, start)
                        + torch.nn.functional.cross_entropy(out.end_logits, end)) / 2
    return net, ids, loss, torch.optim.AdamW, {"foreach": True}


def _pretrain_loss(out, labels, nsp):
    mlm = torch.nn.functional.cross_entropy(out.prediction_logits.flatten(0, 1), labels.flatten())
    return mlm + torch.nn.functional.cross_entropy(out.seq_relationship_logits, nsp)


def capture(model: str, batch: int, precision: str, channels_last: bool = False) -> dict:
    """The Chrome trace of one training step of `model` at `batch` in `precision` ('fp32', 'amp_fp16' or
    'amp_bf16'), on fake tensors, recorded as amp_bench records a suite's case (measure/fake_step.py)."""
    with FakeTensorMode(allow_non_fake_inputs=True):
        net, inputs, loss_fn, opt_class, opt_kwargs = build(model, batch, channels_last)
        optimizer = opt_class(net.parameters(), **opt_kwargs)
        trace, _ = record_step(net.train(), inputs, None, lambda out, _target: loss_fn(out), optimizer,
                               modes.get(precision))
    return trace


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", choices=["resnet50", "bert_base_squad", "bert_large_squad",
                                          "bert_large_pretrain_128", "bert_large_pretrain_512"])
    parser.add_argument("batch", type=int)
    parser.add_argument("precision", choices=["fp32", "amp_fp16", "amp_bf16"])
    parser.add_argument("--channels-last", action="store_true")
    parser.add_argument("-o", "--output", type=Path, required=True)
    args = parser.parse_args()
    trace = capture(args.model, args.batch, args.precision, args.channels_last)
    with gzip.open(args.output, "wt", encoding="utf-8") as fh:
        json.dump(trace, fh)
    print(f"{args.output}: {len(trace['traceEvents'])} events")


if __name__ == "__main__":
    main()
