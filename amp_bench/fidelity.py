"""Accuracy parity: train one model from the same seed on the same real data, in the same order,
under fp32 and each AMP mode, then compare held-out accuracy and the loss curve with fp32.

`fidelity_train.train_precision` runs inside a worker (one per precision); `run_fidelity` here
orchestrates and stores; `verdicts` is the plotting-free comparison used by the CLI and the report.
This module does not import torch, so reading fidelity results never loads it.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd

RUN_COLUMNS = [
    "run_id", "suite", "dataset", "model", "precision", "seed", "status", "reason", "epochs", "steps",
    "batch_size", "train_examples", "test_examples", "test_accuracy", "test_loss", "train_accuracy",
    "final_train_loss", "loss_first", "scaler_initial_scale", "scaler_final_scale", "scaler_min_scale",
    "scaler_max_scale", "scaler_skipped_steps", "scaler_skipped_step_indices", "scaler_growth_steps",
    "scaler_scale_below_one", "grad_underflow_fraction_unscaled", "grad_underflow_fraction_scaled",
    "grad_zero_fraction_fp32", "grad_nonfinite_fraction_scaled", "output_dtype", "emulated", "optimizer", "lr",
    "compile_mode", "fp8_recipe", "fp8_layers_converted", "fp8_layers_skipped", "fp8_skip_reasons",
    "fp8_conv1d_as_linear", "fp8_matmul", "device", "device_name", "architecture", "torch_version", "data_source", "wall_s", "log_file", "hostname",
    "fingerprint", "timestamp",
]
# fp8: per step, the amax of the first float8 layers' input and weight and the scale float8 derives from it
SCALE_COLUMNS = ["run_id", "precision", "seed", "step", "layer", "tensor", "amax", "scale"]
STEP_COLUMNS = ["run_id", "precision", "seed", "epoch", "step", "loss", "scale", "skipped"]
EPOCH_COLUMNS = ["run_id", "precision", "seed", "epoch", "train_loss", "test_loss", "test_accuracy"]
PROBE_COLUMNS = ["run_id", "precision", "seed", "epoch", "step", "probe_scale", "grad_elements",
                 "grad_zero_fraction_fp32", "grad_zero_fraction_unscaled", "grad_underflow_fraction_unscaled",
                 "grad_nonfinite_fraction_unscaled", "grad_zero_fraction_scaled", "grad_underflow_fraction_scaled",
                 "grad_nonfinite_fraction_scaled"]


# --------------------------------------------------------------------------- comparison

def verdicts(runs: pd.DataFrame, tolerance_pp: float | dict) -> pd.DataFrame:
    """One row per run, dataset, model and precision: mean held-out accuracy, its difference from
    fp32 paired by seed (percentage points), fp32's own seed-to-seed range for scale, the final
    training-loss difference, and a verdict: parity (|difference| <= tolerance), worse, better,
    or why there is none. A mode with a second reference (modes.Mode.also_against: fp8 against bf16)
    gets the same difference and verdict against it too."""
    from amp_bench import modes
    columns = ["run_id", "dataset", "model", "precision", "seeds", "paired_seeds", "status", "test_accuracy",
               "accuracy_diff_pp",
               "accuracy_diff_pp_min", "accuracy_diff_pp_max", "fp32_seed_range_pp", "final_train_loss",
               "train_loss_rel_diff", "tolerance_pp", "verdict", "also_against", "accuracy_diff_also_pp",
               "verdict_also"]
    if runs.empty:
        return pd.DataFrame(columns=columns)
    rows = []
    for (run_id, dataset, model), group in runs.groupby(["run_id", "dataset", "model"], sort=False):
        tol = tolerance_pp.get(run_id, 1.0) if isinstance(tolerance_pp, dict) else tolerance_pp
        ok_runs = {p: g[g["status"] == "ok"].set_index("seed") for p, g in group.groupby("precision", sort=False)}
        fp32 = ok_runs.get("fp32", pd.DataFrame(columns=["test_accuracy"]))
        fp32_range = (fp32["test_accuracy"].max() - fp32["test_accuracy"].min()) * 100 if len(fp32) > 1 else np.nan
        for precision, runs_p in group.groupby("precision", sort=False):
            ok = ok_runs[precision]
            row = {"run_id": run_id, "dataset": dataset, "model": model, "precision": precision,
                   "seeds": len(runs_p), "status": "ok" if len(ok) == len(runs_p) else
                   ", ".join(sorted(set(runs_p["status"]) - {"ok"})),
                   "test_accuracy": ok["test_accuracy"].mean() if len(ok) else np.nan,
                   "final_train_loss": ok["final_train_loss"].mean() if len(ok) else np.nan,
                   "fp32_seed_range_pp": fp32_range, "tolerance_pp": tol}
            if precision == "fp32":
                row["verdict"] = "reference" if len(ok) else f"reference {row['status']}"
            else:
                row.update(_against(ok, fp32, "fp32", row["status"], tol))
                also = modes.get(precision).also_against if precision in modes.names() else ""
                if also:
                    second = _against(ok, ok_runs.get(also, pd.DataFrame()), also, row["status"], tol)
                    row.update(also_against=also, accuracy_diff_also_pp=second.get("accuracy_diff_pp"),
                               verdict_also=second["verdict"])
            rows.append(row)
    return pd.DataFrame(rows, columns=columns)


def _against(ok: pd.DataFrame, reference: pd.DataFrame, name: str, status: str, tol: float) -> dict:
    """The paired-by-seed accuracy and loss difference from one reference precision, and the verdict."""
    if not len(ok):
        return {"verdict": f"not measured ({status})"}
    paired = ok.index.intersection(reference.index) if len(reference) else []
    if not len(paired):
        return {"verdict": f"no {name} baseline"}
    diff = (ok.loc[paired, "test_accuracy"] - reference.loc[paired, "test_accuracy"]) * 100
    loss_diff = (ok.loc[paired, "final_train_loss"] - reference.loc[paired, "final_train_loss"]) / \
        reference.loc[paired, "final_train_loss"].abs()
    # rounded: 0.96 - 0.97 is -1.0000000000000009 pp in floats, which must still meet a 1 pp tolerance
    mean = round(float(diff.mean()), 9)
    return {"accuracy_diff_pp": mean, "accuracy_diff_pp_min": diff.min(), "accuracy_diff_pp_max": diff.max(),
            "train_loss_rel_diff": loss_diff.mean(), "paired_seeds": len(paired),
            "verdict": "parity" if abs(mean) <= tol else "worse" if mean < 0 else "better"}


def failed_rows(runs: pd.DataFrame, allow_unsupported: bool = True) -> list[str]:
    """'precision seed N: status (reason)' for every run that did not finish ok: the CLI exits 1 on
    any. `unsupported` (the hardware has no such mode) is a finding, not a failure, unless the
    caller needs every row measured (the GPU check)."""
    allowed = {"ok", "unsupported"} if allow_unsupported else {"ok"}
    out = []
    for _, row in runs.iterrows():
        if row.get("status") not in allowed:
            reason = str(row.get("reason") or "").strip()
            out.append(f"{row.get('precision')} seed {row.get('seed')}: {row.get('status')}"
                       + (f" ({reason.splitlines()[0][:200]})" if reason and reason != "nan" else ""))
    return out


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
    from amp_bench.hardware import may_run, not_run_reason, precision_support
    from amp_bench.results import utc_now
    from amp_bench.session import Session

    reporter = reporter or FidelityReporter()
    session = Session.start(path, device)
    info, probed = session.device, session.probed
    spec = session.suite.fidelity_spec(info.type, overrides)
    store = session.open_store(results_dir, overrides, kind="fidelity", fidelity=spec.to_json())
    host, fingerprint = session.host, session.fingerprint
    store.flush()  # an empty results.csv: the directory is a run like any other
    rows, steps, epochs, probes, scales = [], [], [], [], []
    base = {"run_id": store.run_id, "suite": spec.suite, "dataset": spec.dataset, "model": spec.model,
            "batch_size": spec.batch_size, "optimizer": spec.optimizer.name, "lr": spec.optimizer.lr,
            "device": info.type, "device_name": info.name, "architecture": info.architecture,
            "torch_version": probed["versions"].get("torch_version", ""), "hostname": host["hostname"],
            "fingerprint": fingerprint.get("fingerprint", "")}
    reporter.started(store, info, spec)
    with session.running(lambda: {"cases_finished": len(rows)}):
        for index, precision in enumerate(spec.precisions):
            reporter.precision_started(precision, index, len(spec.precisions))
            support = precision_support(precision, info)
            finished = []
            for seed in spec.seeds:  # one worker per seed: a crash or timeout costs that seed alone
                if not may_run(support, spec.allow_emulated):
                    new = [{**base, "precision": precision, "seed": seed, "status": "unsupported",
                            "reason": not_run_reason(support), "emulated": support.emulated}]
                else:
                    new = _train_in_worker(store, info, dataclasses.replace(spec, seeds=(seed,)), precision, base,
                                           (steps, epochs, probes, scales), reporter)
                stamp = utc_now().isoformat()
                rows += [{**r, "timestamp": stamp} for r in new]
                finished += new
                store.write_table("fidelity_steps", steps, STEP_COLUMNS)
                store.write_table("fidelity_epochs", epochs, EPOCH_COLUMNS)
                store.write_table("fidelity_probes", probes, PROBE_COLUMNS)
                if scales:
                    store.write_table("fidelity_fp8_scales", scales, SCALE_COLUMNS)
                store.write_table("fidelity", rows, RUN_COLUMNS)
            reporter.precision_finished(precision, finished)
    frame = pd.DataFrame(rows, columns=RUN_COLUMNS)
    frame.attrs["run_dir"] = str(store.dir)
    frame.attrs["verdicts"] = verdicts(frame, spec.tolerance_pp)
    return frame


def _train_in_worker(store, info, spec, precision: str, base: dict, tables: tuple, reporter) -> list[dict]:
    """One worker trains spec.seeds under one precision; its rows (the per-step, per-epoch and probe
    tables are appended to `tables`), or one row per seed with the status the worker ended in."""
    from amp_bench.launch import classify_death, death_reason, run_job
    stem = f"fidelity-{precision}-seed{'-'.join(map(str, spec.seeds))}"
    outcome = run_job(store, "fidelity", stem, {"spec": spec.to_json(), "precision": precision,
                                                "device": info.to_json()},
                      spec.timeout_s, on_event=lambda e: reporter.worker_event(precision, e))
    (store.dir / "work" / f"{stem}.result.json").unlink(missing_ok=True)
    result = outcome.result or {}
    log_file = str(outcome.log_path.relative_to(store.dir))
    if "runs" not in result:
        status, reason = (result.get("status"), result.get("reason")) if result else (
            classify_death(outcome), death_reason(outcome, spec.timeout_s))
        return [{**base, "precision": precision, "seed": seed, "status": status, "reason": reason,
                 "log_file": log_file} for seed in spec.seeds]
    steps, epochs, probes, scales = tables
    rows = []
    for run in result["runs"]:
        keys = {"run_id": store.run_id, "precision": precision, "seed": run["seed"]}
        steps += [{**keys, **s} for s in run.pop("step_table", [])]
        epochs += [{**keys, **e} for e in run.pop("epoch_table", [])]
        probes += [{**keys, **p} for p in run.pop("probe_table", [])]
        scales += [{**keys, **p} for p in run.pop("fp8_scale_table", [])]
        rows.append({**base, **run, "log_file": log_file})
    return rows


def load_fidelity(run_dirs: list[Path]) -> dict[str, pd.DataFrame]:
    """The fidelity tables of these run directories (empty frames where there are none), and the
    tolerance each run was judged with."""
    import json
    tables = {"fidelity": RUN_COLUMNS, "fidelity_steps": STEP_COLUMNS, "fidelity_epochs": EPOCH_COLUMNS,
              "fidelity_probes": PROBE_COLUMNS, "fidelity_fp8_scales": SCALE_COLUMNS}
    from amp_bench.results import read_table
    out = {name: read_table(run_dirs, name, columns) for name, columns in tables.items()}
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
