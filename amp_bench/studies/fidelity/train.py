"""The fidelity study's worker side (imports torch): the small models, one seeded training run per
precision and seed on real shipped data, and the per-precision worker entry `train_precision`.
The orchestration and the verdicts, which never need torch, are in fidelity.py.
"""
from __future__ import annotations

import math
import time

import numpy as np
import torch
from torch import nn

from amp_bench import modes

# --------------------------------------------------------------------------- models (worker side)

def build_model(name: str, split, image_size: int | None):
    """(model, prepare) where prepare(x) turns a batch of the dataset into the model's input."""
    if name == "small_cnn":
        def block(cin, cout):
            return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]
        model = nn.Sequential(*block(1, 32), *block(32, 64), nn.MaxPool2d(2), *block(64, 64),
                              nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, split.num_classes))
        return model, lambda x: x
    if name == "tabular_transformer":
        return TabularTransformer(split.train_x.shape[1], split.num_classes), lambda x: x
    if name == "mlp":  # linear-heavy, so fp8 has layers to convert: 256-wide hidden layers
        features = int(np.prod(split.train_x.shape[1:]))
        model = nn.Sequential(nn.Flatten(), nn.Linear(features, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                              nn.Linear(256, split.num_classes))
        return model, lambda x: x
    import torchvision.models  # an image model: upsample the 8x8 digits, three channels
    model = torchvision.models.get_model(name.split("/", 1)[1], weights=None, num_classes=split.num_classes)

    def prepare(x):
        x = torch.nn.functional.interpolate(x, size=(image_size, image_size), mode="bilinear", align_corners=False)
        return x.expand(-1, 3, -1, -1).contiguous()
    return model, prepare


class TabularTransformer(nn.Module):
    """A small FT-Transformer: one token per feature (value x learned vector + bias), a CLS token,
    a 2-layer pre-norm encoder and a linear head on CLS."""

    def __init__(self, features: int, classes: int, width: int = 32, layers: int = 2):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(features, width) * 0.1)
        self.bias = nn.Parameter(torch.zeros(features, width))
        self.cls = nn.Parameter(torch.zeros(1, 1, width))
        layer = nn.TransformerEncoderLayer(width, nhead=4, dim_feedforward=2 * width, dropout=0.1,
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, classes))

    def forward(self, x):
        tokens = x.unsqueeze(-1) * self.weight + self.bias
        tokens = torch.cat([self.cls.expand(x.shape[0], -1, -1), tokens], dim=1)
        return self.head(self.encoder(tokens)[:, 0])


# --------------------------------------------------------------------------- training (worker side)

def _evaluate(model, prepare, x, y, mode, device_type, batch_size: int) -> tuple[float, float]:
    """(accuracy, mean loss) under the precision's own autocast, as the trained model would be used."""
    from amp_bench.measure.precision import autocast_region
    model.eval()
    correct, total_loss = 0, 0.0
    with torch.no_grad():
        for i in range(0, len(x), max(batch_size, 256)):
            xb, yb = prepare(x[i:i + max(batch_size, 256)]), y[i:i + max(batch_size, 256)]
            with autocast_region(mode, device_type):
                logits = model(xb)
            total_loss += float(torch.nn.functional.cross_entropy(logits.float(), yb, reduction="sum"))
            correct += int((logits.argmax(1) == yb).sum())
    model.train()
    return correct / len(x), total_loss / len(x)


def train_one(spec, precision: str, seed: int, device_type: str, torch_device, split, emit) -> dict:
    """Train from `seed` for spec.epochs; the record carries the per-step, per-epoch and probe tables."""
    import random

    from amp_bench.measure.step import TrainStep, build_optimizer

    mode = modes.get(precision)
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # same initial weights under every precision
    model, prepare = build_model(spec.model, split, spec.image_size)
    model = model.to(torch_device).train()
    fp8_columns, scale_probe = {}, None
    if mode.float8_linear:  # the same initial weights, then the linear layers in float8
        from amp_bench.measure.fp8 import ScaleProbe, convert
        fp8_columns = convert(model, spec.fp8_recipe, device_type, spec.fp8_skip_first_last)
        scale_probe = ScaleProbe(model)
    optimizer = build_optimizer(model.parameters(), spec.optimizer)
    from amp_bench.measure.compiling import compile_model
    # compiled: the training step calls the compiled model; evaluation and the gradient probe use the
    # same module (same parameters) eagerly, so accuracy is the trained weights', measured alike
    step = TrainStep(compile_model(model, spec), torch.nn.functional.cross_entropy, optimizer, mode, device_type)
    started = time.perf_counter()
    trained = _epochs(spec, seed, model, prepare, step, mode, device_type, torch_device, split, scale_probe, emit)
    record = _record(spec, precision, seed, model, prepare, step, mode, device_type, split, trained)
    record.update(wall_s=time.perf_counter() - started, **fp8_columns,
                  fp8_scale_table=scale_probe.table() if scale_probe is not None else [])
    return record


def _epochs(spec, seed, model, prepare, step, mode, device_type, torch_device, split, scale_probe, emit) -> dict:
    """The training loop: the same example order under every precision (from `seed`), gradient probes
    every spec.probe_every steps under autocast, the held-out accuracy after each epoch."""
    from amp_bench.measure.scaler_health import gradient_underflow
    order = torch.Generator().manual_seed(seed)
    n = len(split.train_x)
    steps_per_epoch = n // spec.batch_size + (n % spec.batch_size > 1)  # a last batch of one is left out
    probe_every = spec.probe_every or steps_per_epoch
    losses, step_epochs, probes, epochs = [], [], [], []
    index = 0
    for epoch in range(spec.epochs):
        permutation = torch.randperm(n, generator=order).to(torch_device)
        for start in range(0, n, spec.batch_size):
            batch = permutation[start:start + spec.batch_size]
            if len(batch) == 1 < spec.batch_size:  # a last batch of one: batch norm cannot train on it
                continue
            inputs, target = prepare(split.train_x[batch]), split.train_y[batch]
            if mode.uses_autocast and index % probe_every == 0:
                scale = step.scales[-1].item() if step.scales else step.initial_scale
                probes.append({"epoch": epoch, "step": index, **gradient_underflow(
                    model, step.loss_fn, inputs, target, mode, device_type, scale)})
            losses.append(step(inputs, target))
            if scale_probe is not None:
                scale_probe.next_step()
            step_epochs.append(epoch)
            index += 1
        emit(event="step", phase="measure", step=index - 1, total=spec.epochs * steps_per_epoch)
        accuracy, test_loss = _evaluate(model, prepare, split.test_x, split.test_y, mode, device_type, spec.batch_size)
        epochs.append({"epoch": epoch, "train_loss": torch.stack(losses[-steps_per_epoch:]).float().mean().item(),
                       "test_loss": test_loss, "test_accuracy": accuracy})
    return {"losses": losses, "step_epochs": step_epochs, "probes": probes, "epochs": epochs, "steps": index}


def _record(spec, precision, seed, model, prepare, step, mode, device_type, split, trained: dict) -> dict:
    """One seed's record: accuracies and losses, the GradScaler's health, the per-step, per-epoch and probe
    tables, the worst gradient probe, and ok or nonfinite."""
    from amp_bench.measure.scaler_health import scale_history
    loss_values = torch.stack(trained["losses"]).float().cpu().tolist()
    epochs, probes = trained["epochs"], trained["probes"]
    train_accuracy, _ = _evaluate(model, prepare, split.train_x, split.train_y, mode, device_type, spec.batch_size)
    scales = torch.stack(step.scales).float().cpu().tolist() if step.scales else []
    health = scale_history(step.initial_scale, scales)
    skipped = set(health.get("scaler_skipped_step_indices", []))
    record = {
        "precision": precision, "seed": seed, "epochs": spec.epochs, "steps": trained["steps"],
        "test_accuracy": epochs[-1]["test_accuracy"], "test_loss": epochs[-1]["test_loss"],
        "train_accuracy": train_accuracy, "final_train_loss": epochs[-1]["train_loss"],
        "loss_first": loss_values[0], "compile_mode": spec.compile_mode,
        "output_dtype": str(step.output_dtype).replace("torch.", "") if step.output_dtype else "", **health,
        "step_table": [{"epoch": e, "step": i, "loss": v, "scale": scales[i] if scales else None,
                        "skipped": i in skipped}
                       for i, (e, v) in enumerate(zip(trained["step_epochs"], loss_values, strict=True))],
        "epoch_table": epochs, "probe_table": probes,
    }
    if "scaler_skipped_step_indices" in record:
        record["scaler_skipped_step_indices"] = " ".join(map(str, record["scaler_skipped_step_indices"]))
    for key in ("grad_underflow_fraction_unscaled", "grad_underflow_fraction_scaled", "grad_zero_fraction_fp32",
                "grad_nonfinite_fraction_scaled"):
        if probes:  # the worst probe: underflow matters where it is largest
            record[key] = max(p[key] for p in probes)
    bad = [i for i, v in enumerate(loss_values) if not math.isfinite(v)]
    record["status"] = "nonfinite" if bad else "ok"
    record["reason"] = f"loss is {loss_values[bad[0]]} at step {bad[0]} ({len(bad)} non-finite)" if bad else ""
    return record


def train_precision(spec, precision: str, device, events, support) -> dict:
    """Worker entry: every seed of one precision; a seed that fails is recorded, the others still run.
    `support`: the parent's hardware-gate decision (platform.device.precision_support)."""
    import os

    from amp_bench.measure.ending import is_oom
    from amp_bench.measure.precision import autocast_engages, set_fp32_math
    from amp_bench.measure.step import UnsupportedCase
    from amp_bench.platform.device import may_run
    from amp_bench.studies.fidelity.datasets import load

    mode = modes.get(precision)
    if not may_run(support, spec.allow_emulated):
        raise UnsupportedCase(support.reason)
    torch_device = torch.device(device.torch_device)
    if device.type == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS
        torch.cuda.set_device(torch_device)
    # a correctness study: deterministic kernels, so fp32 against fp32 would match exactly
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    set_fp32_math(mode.fp32_math)
    engaged, why = autocast_engages(mode, device.type)
    if not engaged:
        raise UnsupportedCase(why)
    split = load(spec.dataset, spec.test_fraction).to(torch_device)
    runs = []
    for seed in spec.seeds:
        events.emit(event="phase", phase=f"seed {seed}", total=0)
        try:
            record = train_one(spec, precision, seed, device.type, torch_device, split, events.emit)
        except Exception as exc:  # one failed seed must not lose the others
            message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            record = {"precision": precision, "seed": seed, "status": "oom" if is_oom(exc) else "error",
                      "reason": f"{type(exc).__name__}: {message}"[:500]}
        record.update(emulated=support.emulated, data_source=split.source, train_examples=len(split.train_x),
                      test_examples=len(split.test_x))
        runs.append(record)
    return {"runs": runs}
