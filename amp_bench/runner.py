"""Orchestration: suite -> cases -> one worker process per case and repeat -> results store.

What is measured lives in worker.py; where it runs lives in process.py. This module only decides
the order (repeats interleaved across precisions so drift hits both sides), turns each worker
outcome into a result row, and keeps the store up to date after every case.
"""
from __future__ import annotations

import json
import signal
import tempfile
from pathlib import Path

import pandas as pd

from amp_bench import distributed
from amp_bench.environment import fingerprint_columns, host_facts
from amp_bench.errors import UserError
from amp_bench.hardware import DeviceInfo, may_run, precision_support
from amp_bench.process import WorkerOutcome, run_worker
from amp_bench.results import RunStore, make_run_id, order_columns, utc_now
from amp_bench.suite import Case, load_suite

PROBE_TIMEOUT_S = 180.0


class Reporter:
    """Progress callbacks; the CLI renders them with rich, the API stays quiet."""

    def run_started(self, store: RunStore, device: DeviceInfo, total: int) -> None: ...
    def case_started(self, case: Case, repeat: int, index: int, total: int) -> None: ...
    def worker_event(self, case: Case, event: dict) -> None: ...
    def case_finished(self, case: Case, row: dict) -> None: ...


def probe(requested: str) -> dict:
    """Describe the device in a throwaway worker, so this process never creates a CUDA context."""
    with tempfile.TemporaryDirectory(prefix="amp_bench_probe_") as tmp:
        result_path, log_path = Path(tmp) / "probe.json", Path(tmp) / "probe.log"
        outcome = run_worker(["probe", requested, str(result_path)], result_path, log_path, PROBE_TIMEOUT_S)
        if outcome.result is None:
            tail = log_path.read_text(errors="replace").strip().splitlines()[-1:] if log_path.exists() else []
            raise UserError(f"device probe failed (exit code {outcome.exit_code}): {' '.join(tail) or 'no output'}")
    if "error" in outcome.result:
        raise UserError(outcome.result["error"])
    return outcome.result


def schedule(cases: list[Case]) -> list[tuple[Case, int]]:
    """Group by everything but precision; within a group run repeat 0 of every precision, then
    repeat 1, ... (fp32, amp, fp32, amp): drift then hits both sides, and a group is complete
    before the next starts. Each repeat rotates the order, so no mode always runs first."""
    groups: dict[str, list[Case]] = {}
    for case in cases:
        groups.setdefault(case.group_id, []).append(case)
    order = []
    for group in groups.values():
        for repeat in range(group[0].repeats):
            shift = repeat % len(group)
            order.extend((case, repeat) for case in group[shift:] + group[:shift])
    return order


def run_suite(path, *, device: str | None = None, results_dir: str | Path = "results",
              reporter: Reporter | None = None, **overrides) -> pd.DataFrame:
    """Run a suite and return its results (one row per case and repeat).

    `overrides` replace suite settings after the device block: batch_sizes, precisions, steps,
    warmup_steps, repeats, timeout_s, seed, ... The DataFrame's attrs["run_dir"] names the run dir.
    """
    reporter = reporter or Reporter()
    suite = load_suite(path)
    probed = probe(device or suite.device)
    info = DeviceInfo.from_json(probed["device"])
    cases = suite.cases(info.type, overrides)
    plan = schedule(cases)
    store, host, fingerprint = open_store(suite, path, probed, results_dir, overrides, kind="benchmark",
                                          cases_planned=len(plan))
    reporter.run_started(store, info, len(plan))
    status = "interrupted"
    restore = sigterm_as_interrupt()
    try:
        for index, (case, repeat) in enumerate(plan):
            reporter.case_started(case, repeat, index, len(plan))
            row, samples = run_one(case, repeat, info, probed["versions"], store, reporter)
            row["hostname"] = host["hostname"]
            row.update(fingerprint)
            store.add(row, samples)
            reporter.case_finished(case, row)
        status = "complete"
    finally:
        restore()
        saved = store.rows[: store.saved]
        counts = pd.Series([r["status"] for r in saved], dtype=object).value_counts().to_dict()
        store.write_manifest(status=status, finished_at=utc_now().isoformat(), cases_finished=len(saved),
                             status_counts=counts)
    frame = order_columns(pd.DataFrame(store.rows))
    frame.attrs["run_dir"] = str(store.dir)
    return frame


def open_store(suite, path, probed: dict, results_dir, overrides: dict, kind: str, **manifest) -> tuple:
    """A new run directory with its suite copy and manifest: (store, host facts, fingerprint columns).
    Every kind of run (benchmark, fidelity, headroom) records its provenance the same way."""
    host = host_facts()
    info = DeviceInfo.from_json(probed["device"])
    store = RunStore(Path(results_dir), make_run_id(info.label))
    (store.dir / "suite.yaml").write_text(suite.text, encoding="utf-8")
    store.write_manifest(
        run_id=store.run_id, kind=kind, status="running", started_at=utc_now().isoformat(),
        suite={"name": suite.name, "path": str(Path(path).resolve()), "sha256": suite.sha256},
        overrides={k: v for k, v in overrides.items() if v is not None},
        device={**probed["device"], "architecture": probed["architecture"]},
        precision_support=probed["support"], versions=probed["versions"], host=host,
        gpu=probed.get("gpu", {}), software=probed.get("software", {}), **manifest,
    )
    fingerprint = fingerprint_columns(probed["device"], probed["versions"], probed.get("gpu", {}),
                                      host["hostname"])
    return store, host, fingerprint


def sigterm_as_interrupt():
    """A scheduler's SIGTERM stops the run like Ctrl-C: finished cases are kept."""
    def handler(signum, frame):
        raise KeyboardInterrupt
    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        return lambda: None
    return lambda: signal.signal(signal.SIGTERM, previous)


def run_one(case: Case, repeat: int, device: DeviceInfo, versions: dict, store: RunStore,
            reporter: Reporter, stem: str | None = None) -> tuple[dict, list[dict]]:
    """One worker for one case: (result row, per-step samples). `stem` names its log file."""
    row = _base_row(case, repeat, device, versions, store.run_id)
    support = precision_support(case.precision, device)
    if not may_run(support, case.allow_emulated):
        row.update(status="unsupported", reason=support.reason, emulated=support.emulated)
        return row, []
    stem = stem or f"{case.case_id}-r{repeat}"
    spec_path, result_path = store.dir / "work" / f"{stem}.json", store.dir / "work" / f"{stem}.result.json"
    log_path = store.dir / "logs" / f"{stem}.log"
    spec_path.write_text(json.dumps({"case": case.to_json(), "device": device.to_json()}), encoding="utf-8")
    launcher = extra_env = None
    if case.distributed:  # torchrun starts the worker on every rank (docs/distributed.md)
        launcher = distributed.launch_command(case, rdzv_id=f"{case.rdzv_id or case.suite}-{stem}")
        extra_env = distributed.launch_env(case)
    outcome = run_worker(["case", str(spec_path), str(result_path)], result_path, log_path, case.timeout_s,
                         on_event=lambda event: reporter.worker_event(case, event),
                         launcher=launcher, extra_env=extra_env)
    row["log_file"] = str(log_path.relative_to(store.dir))
    row["peak_rss_bytes"] = outcome.peak_rss_bytes
    row["peak_rss_lifetime_bytes"] = outcome.peak_rss_bytes  # from wait4: the whole worker, all of it
    samples = []
    if outcome.result is not None:
        record = dict(outcome.result)
        samples = [{"run_id": store.run_id, "case_id": case.case_id, "precision": case.precision,
                    "repeat": repeat, **s} for s in record.pop("samples", [])]
        row.update(record)
        # peak RSS over the training steps: the worker's high-water mark read right after the
        # measured window, before the instrumented FLOP/phase steps (wait4 sees those too)
        if record.get("rss_hwm_bytes"):
            row["peak_rss_bytes"] = record["rss_hwm_bytes"]
    else:
        row.update(status=classify_death(outcome), reason=death_reason(outcome, case.timeout_s))
        if case.distributed and outcome.timed_out:
            row["reason"] = (f"no result within timeout_s={case.timeout_s:g} (a rank hung or waited for one); "
                             f"torchrun and its {case.world_size} ranks killed")
        if case.distributed and not outcome.timed_out:
            log = outcome.log_path.read_text(errors="replace") if outcome.log_path.exists() else ""
            explained = distributed.explain_failure(result_path, log, case.world_size)
            if explained:
                row["status"], row["reason"] = explained
    spec_path.unlink(missing_ok=True)
    result_path.unlink(missing_ok=True)
    for rank_file in result_path.parent.glob(f"{result_path.name}.rank*"):
        rank_file.unlink(missing_ok=True)
    return row, samples


def classify_death(outcome: WorkerOutcome) -> str:
    if outcome.timed_out:
        return "timeout"
    if outcome.exit_code == -signal.SIGKILL:
        return "oom"
    return "error"


def death_reason(outcome: WorkerOutcome, timeout_s: float) -> str:
    if outcome.timed_out:
        return f"no result within timeout_s={timeout_s:g}; worker killed"
    if outcome.exit_code == -signal.SIGKILL:
        return "worker was killed by SIGKILL without a result (usually the kernel's OOM killer)"
    tail = ""
    if outcome.log_path.exists():
        lines = [l for l in outcome.log_path.read_text(errors="replace").splitlines() if l.strip()]
        tail = lines[-1][:300] if lines else ""
    return f"worker exited with code {outcome.exit_code} without a result" + (f": {tail}" if tail else "")


def _base_row(case: Case, repeat: int, device: DeviceInfo, versions: dict, run_id: str) -> dict:
    return {
        "run_id": run_id, "suite": case.suite, "case_id": case.case_id, "group_id": case.group_id,
        "model": case.model.ref, "model_label": case.model.label, "batch_size": case.batch_size,
        "precision": case.precision, "channels_last": case.channels_last, "image_size": case.image_size,
        "seq_len": case.seq_len, "device": device.type, "device_name": device.name,
        "architecture": device.architecture, "repeat": repeat, "warmup_steps": case.warmup_steps,
        "steps": case.steps, "optimizer": case.optimizer.name, "optimizer_impl": case.optimizer.impl,
        "seed": case.seed, **_distributed_columns(case, device),
        "torch_version": versions.get("torch_version", ""),
        "cuda_version": versions.get("torch_cuda_version", ""), "cudnn_version": versions.get("cudnn_version", ""),
        "timestamp": utc_now().isoformat(),
    }


def _distributed_columns(case: Case, device: DeviceInfo) -> dict:
    backend = "" if not case.distributed else (
        case.dist_backend if case.dist_backend != "auto" else ("nccl" if device.type == "cuda" else "gloo"))
    return {"world_size": case.world_size, "nnodes": case.nnodes, "nproc_per_node": case.nproc_per_node,
            "dist_backend": backend, "global_batch_size": case.batch_size * case.world_size,
            "scaling": distributed.SCALING if case.distributed else "single process"}
