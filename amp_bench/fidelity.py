"""Accuracy parity: train one model from the same seed on the same real data, in the same order,
under fp32 and each AMP mode, then compare held-out accuracy and the loss curve with fp32.

`train_precision` runs inside a worker (one per precision, all seeds); `run_fidelity` orchestrates
and stores; `verdicts` is the plotting-free comparison used by the CLI and the report.
"""
from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch import nn

RUN_COLUMNS = [
    "run_id", "suite", "dataset", "model", "precision", "seed", "status", "reason", "epochs", "steps",
    "batch_size", "train_examples", "test_examples", "test_accuracy", "test_loss", "train_accuracy",
    "final_train_loss", "loss_first", "scaler_initial_scale", "scaler_final_scale", "scaler_min_scale",
    "scaler_max_scale", "scaler_skipped_steps", "scaler_skipped_step_indices", "scaler_growth_steps",
    "scaler_scale_below_one", "grad_underflow_fraction_unscaled", "grad_underflow_fraction_scaled",
    "grad_zero_fraction_fp32", "grad_nonfinite_fraction_scaled", "output_dtype", "emulated", "optimizer", "lr",
    "device", "device_name", "architecture", "torch_version", "data_source", "wall_s", "log_file", "hostname",
    "fingerprint", "timestamp",
]
STEP_COLUMNS = ["run_id", "precision", "seed", "epoch", "step", "loss", "scale", "skipped"]
EPOCH_COLUMNS = ["run_id", "precision", "seed", "epoch", "train_loss", "test_loss", "test_accuracy"]
PROBE_COLUMNS = ["run_id", "precision", "seed", "epoch", "step", "probe_scale", "grad_elements",
                 "grad_zero_fraction_fp32", "grad_zero_fraction_unscaled", "grad_underflow_fraction_unscaled",
                 "grad_nonfinite_fraction_unscaled", "grad_zero_fraction_scaled", "grad_underflow_fraction_scaled",
                 "grad_nonfinite_fraction_scaled"]


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
    from amp_bench.precision import autocast_region
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

    from amp_bench.precision import get_mode
    from amp_bench.scaler_health import gradient_underflow, scale_history
    from amp_bench.step import TrainStep, build_optimizer

    mode = get_mode(precision)
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # same initial weights under every precision
    model, prepare = build_model(spec.model, split, spec.image_size)
    model = model.to(torch_device).train()
    optimizer = build_optimizer(model.parameters(), spec.optimizer)
    loss_fn = torch.nn.functional.cross_entropy
    step = TrainStep(model, loss_fn, optimizer, mode, device_type)
    order = torch.Generator().manual_seed(seed)  # same example order under every precision

    n = len(split.train_x)
    steps_per_epoch = n // spec.batch_size + (n % spec.batch_size > 1)  # a last batch of one is left out
    probe_every = spec.probe_every or steps_per_epoch
    losses, step_epochs, probes, epochs = [], [], [], []
    started = time.perf_counter()
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
                    model, loss_fn, inputs, target, mode, device_type, scale)})
            losses.append(step(inputs, target))
            step_epochs.append(epoch)
            index += 1
        emit(event="step", phase="measure", step=index - 1, total=spec.epochs * steps_per_epoch)
        epoch_losses = torch.stack(losses[-steps_per_epoch:]).float().mean().item()
        accuracy, test_loss = _evaluate(model, prepare, split.test_x, split.test_y, mode, device_type,
                                        spec.batch_size)
        epochs.append({"epoch": epoch, "train_loss": epoch_losses, "test_loss": test_loss,
                       "test_accuracy": accuracy})
    loss_values = torch.stack(losses).float().cpu().tolist()
    train_accuracy, _ = _evaluate(model, prepare, split.train_x, split.train_y, mode, device_type, spec.batch_size)
    scales = torch.stack(step.scales).float().cpu().tolist() if step.scales else []
    health = scale_history(step.initial_scale, scales)
    skipped = set(health.get("scaler_skipped_step_indices", []))
    record = {
        "precision": precision, "seed": seed, "epochs": spec.epochs, "steps": index,
        "test_accuracy": epochs[-1]["test_accuracy"], "test_loss": epochs[-1]["test_loss"],
        "train_accuracy": train_accuracy, "final_train_loss": epochs[-1]["train_loss"],
        "loss_first": loss_values[0], "wall_s": time.perf_counter() - started,
        "output_dtype": str(step.output_dtype).replace("torch.", "") if step.output_dtype else "",
        **health,
        "step_table": [{"epoch": e, "step": i, "loss": v, "scale": scales[i] if scales else None,
                        "skipped": i in skipped} for i, (e, v) in enumerate(zip(step_epochs, loss_values))],
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


def train_precision(spec, precision: str, device, events) -> dict:
    """Worker entry: every seed of one precision; a seed that fails is recorded, the others still run."""
    import os

    from amp_bench.datasets import load
    from amp_bench.hardware import may_run, precision_support
    from amp_bench.precision import autocast_engages, get_mode, set_fp32_math
    from amp_bench.step import UnsupportedCase
    from amp_bench.worker import is_oom

    mode = get_mode(precision)
    support = precision_support(precision, device)
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
    split = load(spec.dataset, spec.test_fraction)
    source = split.source
    split = split.to(torch_device)
    runs = []
    for seed in spec.seeds:
        events.emit(event="phase", phase=f"seed {seed}", total=0)
        try:
            record = train_one(spec, precision, seed, device.type, torch_device, split, events.emit)
        except Exception as exc:  # noqa: BLE001 - one failed seed must not lose the others
            message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            record = {"precision": precision, "seed": seed, "status": "oom" if is_oom(exc) else "error",
                      "reason": f"{type(exc).__name__}: {message}"[:500]}
        record.update(emulated=support.emulated, data_source=source, train_examples=len(split.train_x),
                      test_examples=len(split.test_x))
        runs.append(record)
    return {"runs": runs}


# --------------------------------------------------------------------------- comparison

def verdicts(runs: pd.DataFrame, tolerance_pp: float | dict) -> pd.DataFrame:
    """One row per run, dataset, model and precision: mean held-out accuracy, its difference from
    fp32 paired by seed (percentage points), fp32's own seed-to-seed range for scale, the final
    training-loss difference, and a verdict: parity (|difference| <= tolerance), worse, better,
    or why there is none."""
    columns = ["run_id", "dataset", "model", "precision", "seeds", "paired_seeds", "status", "test_accuracy",
               "accuracy_diff_pp",
               "accuracy_diff_pp_min", "accuracy_diff_pp_max", "fp32_seed_range_pp", "final_train_loss",
               "train_loss_rel_diff", "tolerance_pp", "verdict"]
    if runs.empty:
        return pd.DataFrame(columns=columns)
    rows = []
    for (run_id, dataset, model), group in runs.groupby(["run_id", "dataset", "model"], sort=False):
        tol = tolerance_pp.get(run_id, 1.0) if isinstance(tolerance_pp, dict) else tolerance_pp
        fp32 = group[(group["precision"] == "fp32") & (group["status"] == "ok")].set_index("seed")
        fp32_range = (fp32["test_accuracy"].max() - fp32["test_accuracy"].min()) * 100 if len(fp32) > 1 else np.nan
        for precision, runs_p in group.groupby("precision", sort=False):
            ok = runs_p[runs_p["status"] == "ok"].set_index("seed")
            row = {"run_id": run_id, "dataset": dataset, "model": model, "precision": precision,
                   "seeds": len(runs_p), "status": "ok" if len(ok) == len(runs_p) else
                   ", ".join(sorted(set(runs_p["status"]) - {"ok"})),
                   "test_accuracy": ok["test_accuracy"].mean() if len(ok) else np.nan,
                   "final_train_loss": ok["final_train_loss"].mean() if len(ok) else np.nan,
                   "fp32_seed_range_pp": fp32_range, "tolerance_pp": tol}
            paired = ok.index.intersection(fp32.index)
            if precision == "fp32":
                row["verdict"] = "reference" if len(ok) else f"reference {row['status']}"
            elif not len(ok):
                row["verdict"] = f"not measured ({row['status']})"
            elif not len(paired):
                row["verdict"] = "no fp32 baseline"
            else:
                diff = (ok.loc[paired, "test_accuracy"] - fp32.loc[paired, "test_accuracy"]) * 100
                loss_diff = (ok.loc[paired, "final_train_loss"] - fp32.loc[paired, "final_train_loss"]) / \
                    fp32.loc[paired, "final_train_loss"].abs()
                # rounded: 0.96 - 0.97 is -1.0000000000000009 pp in floats, which must still meet a 1 pp tolerance
                mean = round(float(diff.mean()), 9)
                row.update(accuracy_diff_pp=mean, accuracy_diff_pp_min=diff.min(), accuracy_diff_pp_max=diff.max(),
                           train_loss_rel_diff=loss_diff.mean(), paired_seeds=len(paired))
                row["verdict"] = "parity" if abs(mean) <= tol else "worse" if mean < 0 else "better"
            rows.append(row)
    return pd.DataFrame(rows, columns=columns)


# --------------------------------------------------------------------------- orchestration

class FidelityReporter:
    def started(self, store, device, spec) -> None: ...
    def precision_started(self, precision: str, index: int, total: int) -> None: ...
    def worker_event(self, precision: str, event: dict) -> None: ...
    def precision_finished(self, precision: str, rows: list[dict]) -> None: ...


def run_fidelity(path, *, device: str | None = None, results_dir="results", reporter=None,
                 **overrides) -> pd.DataFrame:
    """Run the suite's fidelity section; returns one row per precision and seed (attrs: run_dir,
    verdicts). Each precision trains in its own worker; results are saved after each."""
    from amp_bench.hardware import DeviceInfo, may_run, precision_support
    from amp_bench.results import utc_now
    from amp_bench.runner import open_store, probe, sigterm_as_interrupt
    from amp_bench.suite import load_suite

    reporter = reporter or FidelityReporter()
    suite = load_suite(path)
    probed = probe(device or suite.device)
    info = DeviceInfo.from_json(probed["device"])
    spec = suite.fidelity_spec(info.type, overrides)
    store, host, fingerprint = open_store(suite, path, probed, results_dir, overrides, kind="fidelity",
                                          fidelity=spec.to_json())
    store.flush()  # an empty results.csv: the directory is a run like any other
    rows, steps, epochs, probes = [], [], [], []
    base = {"run_id": store.run_id, "suite": spec.suite, "dataset": spec.dataset, "model": spec.model,
            "batch_size": spec.batch_size, "optimizer": spec.optimizer.name, "lr": spec.optimizer.lr,
            "device": info.type, "device_name": info.name, "architecture": info.architecture,
            "torch_version": probed["versions"].get("torch_version", ""), "hostname": host["hostname"],
            "fingerprint": fingerprint.get("fingerprint", "")}
    reporter.started(store, info, spec)
    status = "interrupted"
    restore = sigterm_as_interrupt()
    try:
        for index, precision in enumerate(spec.precisions):
            reporter.precision_started(precision, index, len(spec.precisions))
            support = precision_support(precision, info)
            finished = []
            for seed in spec.seeds:  # one worker per seed: a crash or timeout costs that seed alone
                if not may_run(support, spec.allow_emulated):
                    new = [{**base, "precision": precision, "seed": seed, "status": "unsupported",
                            "reason": support.reason, "emulated": support.emulated}]
                else:
                    new = _train_in_worker(store, info, dataclasses.replace(spec, seeds=(seed,)), precision, base,
                                           (steps, epochs, probes), reporter)
                stamp = utc_now().isoformat()
                rows += [{**r, "timestamp": stamp} for r in new]
                finished += new
                store.write_table("fidelity_steps", steps, STEP_COLUMNS)
                store.write_table("fidelity_epochs", epochs, EPOCH_COLUMNS)
                store.write_table("fidelity_probes", probes, PROBE_COLUMNS)
                store.write_table("fidelity", rows, RUN_COLUMNS)
            reporter.precision_finished(precision, finished)
        status = "complete"
    finally:
        restore()
        store.write_manifest(status=status, finished_at=utc_now().isoformat(), cases_finished=len(rows))
    frame = pd.DataFrame(rows, columns=RUN_COLUMNS)
    frame.attrs["run_dir"] = str(store.dir)
    frame.attrs["verdicts"] = verdicts(frame, spec.tolerance_pp)
    return frame


def _train_in_worker(store, info, spec, precision: str, base: dict, tables: tuple, reporter) -> list[dict]:
    """One worker trains spec.seeds under one precision; its rows (the per-step, per-epoch and probe
    tables are appended to `tables`), or one row per seed with the status the worker ended in."""
    import json

    from amp_bench.process import run_worker
    from amp_bench.runner import classify_death, death_reason
    stem = f"fidelity-{precision}-seed{'-'.join(map(str, spec.seeds))}"
    spec_path, result_path = store.dir / "work" / f"{stem}.json", store.dir / "work" / f"{stem}.result.json"
    log_path = store.dir / "logs" / f"{stem}.log"
    spec_path.write_text(json.dumps({"spec": spec.to_json(), "precision": precision, "device": info.to_json()}),
                         encoding="utf-8")
    outcome = run_worker(["fidelity", str(spec_path), str(result_path)], result_path, log_path, spec.timeout_s,
                         on_event=lambda e: reporter.worker_event(precision, e))
    spec_path.unlink(missing_ok=True)
    result_path.unlink(missing_ok=True)
    result = outcome.result or {}
    log_file = str(log_path.relative_to(store.dir))
    if "runs" not in result:
        status, reason = (result.get("status"), result.get("reason")) if result else (
            classify_death(outcome), death_reason(outcome, spec.timeout_s))
        return [{**base, "precision": precision, "seed": seed, "status": status, "reason": reason,
                 "log_file": log_file} for seed in spec.seeds]
    steps, epochs, probes = tables
    rows = []
    for run in result["runs"]:
        keys = {"run_id": store.run_id, "precision": precision, "seed": run["seed"]}
        steps += [{**keys, **s} for s in run.pop("step_table", [])]
        epochs += [{**keys, **e} for e in run.pop("epoch_table", [])]
        probes += [{**keys, **p} for p in run.pop("probe_table", [])]
        rows.append({**base, **run, "log_file": log_file})
    return rows


def load_fidelity(run_dirs: list[Path]) -> dict[str, pd.DataFrame]:
    """The fidelity tables of these run directories (empty frames where there are none), and the
    tolerance each run was judged with."""
    import json
    tables = {"fidelity": RUN_COLUMNS, "fidelity_steps": STEP_COLUMNS, "fidelity_epochs": EPOCH_COLUMNS,
              "fidelity_probes": PROBE_COLUMNS}
    out = {}
    for name, columns in tables.items():
        frames = [pd.read_csv(d / f"{name}.csv") for d in run_dirs if (d / f"{name}.csv").is_file()]
        frames = [f for f in frames if not f.empty]
        out[name] = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)
    tolerance = {}
    for d in run_dirs:
        try:
            manifest = json.loads((d / "manifest.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if "fidelity" in manifest:
            tolerance[manifest.get("run_id", d.name)] = manifest["fidelity"].get("tolerance_pp", 1.0)
    out["verdicts"] = verdicts(out["fidelity"], tolerance)
    return out
