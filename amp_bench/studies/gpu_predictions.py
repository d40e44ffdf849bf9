"""What the GPUs this machine does not have would give: a suite's GPU cases (its cuda: block: models, batch
sizes, layouts, modes, sequence lengths) with each mode's training step recorded on fake tensors in a
worker (measure/fake_step.py: no GPU, no real compute), cached (store/inventories.py), and priced on each
target by analysis/predict. `predict SUITE` and `predict RUN_DIR` of a CPU run take this path, and so does
the end of a run on a machine without a GPU ("On GPUs (predicted, nothing measured here)").

fp32 and tf32 share one recording (the same ops; the math differs on the target); a case whose model cannot
run on fake tensors, or fp8 where torchao's float8 does not trace on them, is named with its reason.
"""
from __future__ import annotations

from pathlib import Path

from amp_bench import identity
from amp_bench.analysis.predict.settings import SUITE_FILE, chosen
from amp_bench.errors import UserError
from amp_bench.store import inventories
from amp_bench.suite import Case, load_suite

RECORD_TIMEOUT_S = 600.0


def gpu_cases(suite_path) -> list[Case]:
    """The suite's cases as a GPU would run them (its cuda: block over the top level). A compiled case is
    recorded, and priced, as its eager step (torch.compile's fusions are not modelled; the notes say so)."""
    return load_suite(suite_path).cases("cuda")


def _missing(cases: list[Case]) -> dict[str, tuple[Case, inventories.Entry]]:
    todo = {}
    for case in cases:
        entry = inventories.entry(case.to_json())
        if not entry.complete():
            todo.setdefault(inventories.key(case.to_json()), (case, entry))
    return todo


def record_missing(cases: list[Case], log_dir: Path | None = None, server=None,
                   timeout_s: float = RECORD_TIMEOUT_S) -> dict[str, str]:
    """Record, in one worker, every case whose step is not cached yet; {cache key: why not} for the cases
    that could not be recorded (an empty dict when all were, or none had to be)."""
    from amp_bench.launchers.forkserver import launch_spec
    todo = _missing(cases)
    if not todo:
        return {}
    joined = _zygote([case.model.ref for case, _ in todo.values()]) if server is None else None
    items = [{"key": key, "case": case.to_json(), "trace": str(entry.trace), "memory": str(entry.memory)}
             for key, (case, entry) in todo.items()]
    log = log_dir / "inventories.log" if log_dir else None
    try:
        outcome = launch_spec("inventory", {"items": items}, log, timeout_s, server=server or joined)
    finally:
        if joined is not None:
            joined.close()
    if outcome.result is None:
        why = "timed out" if outcome.timed_out else f"the recording worker died (exit {outcome.exit_code})"
        return {key: why for key in todo}
    return dict(outcome.result.get("failed") or {})


def _zygote(refs: list[str]):
    """The shared fork server the environment names (a test command's, a script's), joined for this one
    worker: its imports are done; None without one (the worker then starts a fresh interpreter)."""
    import os

    from amp_bench.launchers.forkserver import ZYGOTE_ENV, ForkServer
    from amp_bench.suite.model_refs import preload_modules
    return ForkServer.join(os.environ[ZYGOTE_ENV], preload_modules(refs)) if os.environ.get(ZYGOTE_ENV) else None


def sources(cases: list[Case], failed: dict[str, str]):
    """One prediction source per case (its modes' recorded steps), in the suite's order."""
    from amp_bench.analysis.predict.source import recorded_source
    grouped: dict[str, dict] = {}
    for case in cases:
        axes = case.axes
        group = grouped.setdefault(identity.group_id(axes), {"axes": axes, "batch": case.batch_size,
                                                             "recorded": {}, "failed": {}})
        case_key = inventories.key(case.to_json())
        entry = inventories.entry(case.to_json())
        if case_key in failed or not entry.complete():
            group["failed"][case.precision] = "could not be recorded on fake tensors: " + \
                failed.get(case_key, "its recording is missing")
        else:
            group["recorded"][case.precision] = (entry.trace, entry.read_memory())
    return [recorded_source(identity.case_label(g["axes"]), g["axes"], g["batch"], g["recorded"], g["failed"])
            for g in grouped.values()]


def predict_suite(suite_path, targets: list[str], fp32_as: str | None = None, log_dir: Path | None = None,
                  server=None):
    """The suite's GPU cases predicted on `targets` (analysis/predict/model.RunPrediction)."""
    from amp_bench.analysis.predict.model import predict_cases, resolve_targets
    resolve_targets(targets)  # a bad key is refused before anything is recorded
    cases = gpu_cases(suite_path)
    if not cases:
        raise UserError(f"{suite_path}: no case to predict (the suite's matrix is empty on cuda)")
    return predict_cases(sources(cases, record_missing(cases, log_dir, server)), targets, fp32_as)


def predict_source(source, targets: list[str], fp32_as: str | None = None, source_gpu: str | None = None):
    """`predict SOURCE`: a suite file's GPU cases; a GPU run's profiled steps, rescaled; a run from a machine
    without a GPU, its suite's GPU cases (the cases a GPU user would run, not the CPU block's)."""
    from amp_bench.analysis.predict.model import predict_run
    from amp_bench.analysis.predict.source import is_gpu_run
    source = Path(source)
    if source.is_file():
        return predict_suite(source, targets, fp32_as)
    if not source.is_dir():
        raise UserError(f"{source}: no such suite file or run directory")
    if not (source / "results.csv").is_file():
        raise UserError(f"{source}: no results.csv (expected a run directory written by `amp_bench run`, "
                        "or a suite file)")
    if is_gpu_run(source):
        return predict_run(source, targets, fp32_as, source_gpu)
    if not (source / SUITE_FILE).is_file():
        raise UserError(f"{source}: a CPU run without its {SUITE_FILE}: its suite's GPU cases cannot be read")
    return predict_suite(source / SUITE_FILE, targets, fp32_as)  # reading a run writes nothing into it


def after_cpu_run(run_dir, server=None, targets: list[str] | None = None):
    """The end of a run on a machine without a GPU: its suite's GPU cases predicted on `targets`, else its
    predict: block's, else DEFAULT_TARGETS, written to RUN_DIR/predicted.csv (a prediction, beside the measured
    results, never in them); None when the run measured on a GPU or kept no suite."""
    from amp_bench.analysis.predict.source import is_gpu_run
    from amp_bench.store.results import write_table
    run_dir = Path(run_dir)
    if is_gpu_run(run_dir) or not (run_dir / SUITE_FILE).is_file():
        return None
    result = predict_suite(run_dir / SUITE_FILE, *chosen(run_dir, targets), log_dir=run_dir / "logs", server=server)
    write_table(run_dir, "predicted", result.table.to_dict("records"))
    return result
