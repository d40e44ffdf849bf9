"""Issue 23's CPU check, by hand: profile one step of a model in fp32 and amp_bf16 after a short timed
window, print the per-category breakdown, its consistency (categories against busy time, "other")
and the sentence.

    python benchmarks/explain_cpu_check.py resnet50      # the resnet50 suite's CPU block: batch 8, 224 px
    python benchmarks/explain_cpu_check.py gpt2          # transformers GPT-2, 2 layers, seq 128, batch 8
    python benchmarks/explain_cpu_check.py bert          # transformers BERT, 2 layers (sequence classification)

The timed window here is 5 steps after 2 warmup steps (a check, not a measurement: `run` measures);
traces go to /tmp/explain_<model>_<precision>.json.gz (Perfetto opens them).
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from amp_bench import modes
from amp_bench.analysis.explain.categories import CATEGORIES
from amp_bench.analysis.explain.ceiling import cpu_unit, ideal_factors
from amp_bench.analysis.explain.decompose import decompose, times_from_row
from amp_bench.analysis.explain.judge import explain_row
from amp_bench.analysis.explain.sentence import sentence
from amp_bench.measure.models import build_workload
from amp_bench.measure.step import TrainStep, build_optimizer
from amp_bench.measure.telemetry.profile import capture
from amp_bench.platform.device import effective_cpu_flags, read_cpu_info
from amp_bench.suite import OptimizerSpec

SGD = OptimizerSpec(name="sgd", impl="foreach", lr=0.1, momentum=0.9, weight_decay=1e-4)
ADAMW = OptimizerSpec(name="adamw", impl="foreach", lr=1e-4, weight_decay=0.01)
MODELS = {
    "resnet50": ({"ref": "torchvision/resnet50"}, {"image_size": 224, "seq_len": None}, SGD),
    "resnet18": ({"ref": "torchvision/resnet18"}, {"image_size": 224, "seq_len": None}, SGD),
    "gpt2": ({"ref": "transformers/gpt2", "config": {"n_layer": 2}}, {"image_size": None, "seq_len": 128}, ADAMW),
    "bert": ({"ref": "transformers/bert-base-uncased", "config": {"num_hidden_layers": 2}},
             {"image_size": None, "seq_len": 128}, ADAMW),
}


def check(name: str, batch: int = 8, precisions=("fp32", "amp_bf16")) -> None:
    spec, sizes, optimizer = MODELS[name]
    rows = {}
    for precision in precisions:
        torch.manual_seed(0)
        workload = build_workload(spec, channels_last=False, **sizes)
        model = workload.model.train()
        step = TrainStep(model, workload.loss_fn, build_optimizer(model.parameters(), optimizer),
                         modes.get(precision), "cpu")
        inputs, target = workload.make_batch(batch, torch.device("cpu"))
        for _ in range(2):
            step(inputs, target)
        times = []
        for _ in range(5):
            start = time.perf_counter()
            step(inputs, target)
            times.append((time.perf_counter() - start) * 1e3)
        median = statistics.median(times)
        trace = Path(f"/tmp/explain_{name}_{precision}.json.gz")  # the worker's capture, then the parent's judging
        captured = capture(step, inputs, target, "cpu", str(trace))
        cols = explain_row({"status": "ok", "device": "cpu", "precision": precision, "step_time_ms_median": median,
                            **captured, "explain_trace": trace.name}, trace.parent)
        rows[precision] = {**cols, "median": median}
        if cols["explain_status"] == "unavailable":
            print(f"== {name} bs{batch} {precision}: unavailable: {cols['explain_reason']}")
            continue
        total = sum(cols[f"explain_{c}_ms"] for c in CATEGORIES)
        busy = cols["explain_busy_ms"]
        print(f"== {name} bs{batch} {precision}: measured median {median:.0f} ms, profiled step "
              f"{cols['explain_profiled_ms']:.0f} ms (x{cols['explain_profiled_vs_measured']:.2f}), "
              f"busy {busy:.0f} ms, "
              f"categories {total:.0f} ms = {total / busy:.1%} of busy, host {cols['explain_host_ms']:.0f} ms, "
              f"other {cols['explain_other_share']:.2%}, {cols['explain_status']} {cols['explain_reason']}")
        for category in CATEGORIES:
            ms = cols[f"explain_{category}_ms"]
            print(f"   {category:14s} {ms:9.1f} ms {ms / total:6.1%}")
        print("   phases (ms):", {p: round(cols[f"explain_phase_{p}_ms"] or 0.0) for p in
                                   ("forward", "backward", "optimizer", "scaler")})
        print(f"   misaligned FLOP share {cols['explain_misaligned_flop_share'] or 0:.1%}: "
              f"{cols['explain_misaligned_layers'][:160]}")
    base, mode = rows.get("fp32"), rows.get("amp_bf16")
    if base and mode and "unavailable" not in (base["explain_status"], mode["explain_status"]):
        ratio, source = cpu_unit("amp_bf16", ",".join(effective_cpu_flags(read_cpu_info()[1])))
        d = decompose(times_from_row(base), times_from_row(mode), "amp_bf16", measured_speedup=base["median"] /
                      mode["median"], distorted="distorted" in (base["explain_status"], mode["explain_status"]),
                      device_type="cpu",
                      ideal=ideal_factors("amp_bf16", dict.fromkeys(("gemm", "conv", "attention"), ratio), source))
        print(d.table.round(3).to_string(index=False))
        print(f"{name} bs {batch}: {sentence(d)}")


if __name__ == "__main__":
    for model_name in sys.argv[1:] or ["resnet50"]:
        check(model_name)
