"""Accuracy parity: train one model from the same seed on the same real data, in the same order,
under fp32 and each AMP mode, then compare held-out accuracy and the loss curve with fp32.

`fidelity_train.train_precision` runs inside a worker (one per precision); `run_fidelity` here
orchestrates and stores; `verdicts` is the plotting-free comparison used by the CLI and the report.
This module does not import torch, so reading fidelity results never loads it.
"""
from __future__ import annotations

import dataclasses

import pandas as pd

from amp_bench.analysis.fidelity import verdicts
from amp_bench.store.columns import STUDY_TABLES

# --------------------------------------------------------------------------- orchestration

class FidelityReporter:
    def started(self, store, device, spec) -> None: ...
    def precision_started(self, precision: str, index: int, total: int) -> None: ...
    def worker_event(self, precision: str, event: dict) -> None: ...
    def precision_finished(self, precision: str, rows: list[dict]) -> None: ...


def run_fidelity(path, *, device: str | None = None, results_dir="results", reporter=None, **overrides) -> pd.DataFrame:
    """Run the suite's fidelity section; returns one row per precision and seed (attrs: run_dir,
    verdicts). Each precision trains in its own worker; results are saved after each."""
    from amp_bench.platform.device import may_run, not_run_reason, precision_support
    from amp_bench.store.results import utc_now
    from amp_bench.studies.session import Session

    reporter = reporter or FidelityReporter()
    session = Session.start(path, device)
    info = session.device
    spec = session.suite.fidelity_spec(info.type, overrides)
    store = session.open_store(results_dir, overrides, kind="fidelity", fidelity=spec.to_json())
    store.flush()  # an empty results.csv: the directory is a run like any other
    rows, steps, epochs, probes, scales = [], [], [], [], []
    base = {"run_id": store.run_id, "suite": spec.suite, "dataset": spec.dataset, "model": spec.model,
            "batch_size": spec.batch_size, "optimizer": spec.optimizer.name, "lr": spec.optimizer.lr,
            "device": info.type, "device_name": info.name, "architecture": info.architecture,
            "torch_version": session.versions.get("torch_version", ""), "hostname": session.host["hostname"],
            "fingerprint": session.fingerprint.get("fingerprint", "")}
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
                                           (steps, epochs, probes, scales), reporter, support, session.server)
                stamp = utc_now().isoformat()
                rows += [{**r, "timestamp": stamp} for r in new]
                finished += new
                store.write_table("fidelity_steps", steps)
                store.write_table("fidelity_epochs", epochs)
                store.write_table("fidelity_probes", probes)
                if scales:
                    store.write_table("fidelity_fp8_scales", scales)
                store.write_table("fidelity", rows)
            reporter.precision_finished(precision, finished)
    frame = pd.DataFrame(rows, columns=list(STUDY_TABLES["fidelity"]))
    frame.attrs["run_dir"] = str(store.dir)
    frame.attrs["verdicts"] = verdicts(frame, spec.tolerance_pp)
    return frame


def _train_in_worker(store, info, spec, precision: str, base: dict, tables: tuple, reporter, support,
                     server=None) -> list[dict]:
    """One worker trains spec.seeds under one precision; its rows (the per-step, per-epoch and probe
    tables are appended to `tables`), or one row per seed with the status the worker ended in. With
    the study's fork server, the worker is its child, as a run's cases are."""
    from amp_bench.launchers.launch import death, run_job
    stem = f"fidelity-{precision}-seed{'-'.join(map(str, spec.seeds))}"
    outcome = run_job(store, "fidelity", stem, {"spec": spec.to_json(), "precision": precision,
                                                "device": info.to_json(), "support": dataclasses.asdict(support)},
                      spec.timeout_s, on_event=lambda e: reporter.worker_event(precision, e), server=server)
    store.work_path(stem, ".result.json").unlink(missing_ok=True)
    result = outcome.result or {}
    log_file = str(outcome.log_path.relative_to(store.dir))
    if "runs" not in result:
        status, reason = (result.get("status"), result.get("reason")) if result else death(outcome, spec.timeout_s)
        return [{**base, "precision": precision, "seed": seed, "status": status, "reason": reason,
                 "log_file": log_file} for seed in spec.seeds]
    rows = []
    for run in result["runs"]:
        keys = {"run_id": store.run_id, "precision": precision, "seed": run["seed"]}
        for table, name in zip(tables, ("step_table", "epoch_table", "probe_table", "fp8_scale_table"), strict=True):
            table.extend({**keys, **r} for r in run.pop(name, []))
        rows.append({**base, **run, "worker_start": outcome.started_by, "log_file": log_file})
    return rows
