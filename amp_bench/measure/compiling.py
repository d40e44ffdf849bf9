"""torch.compile as a case axis: what is compiled, how warmup waits for compilation to settle, and
what dynamo's own counters say about it (graph breaks, recompiles, unique graphs).

What is compiled (docs/measuring.md, "torch.compile"): the model, `torch.compile(model, mode, backend,
fullgraph)`, called inside the autocast region of the TrainStep exactly as eager calls it; the loss,
backward (AOTAutograd compiles the backward graph with the forward), GradScaler and zero_grad stay
in eager Python. With compile_optimizer the optimizer's step() is compiled too (GradScaler.step
calls it). torch is imported at call time: the suite layer imports this module's constants.
"""
from __future__ import annotations

import time

SETTLE_STEPS = 3  # compilation has settled after this many steps in a row compiled nothing new
MAX_SETTLE_STEPS = 50  # ...or after this many steps beyond warmup_steps (then the row says it never settled)
REASONS_KEPT = 3  # graph-break and recompile reasons written to the row and the log


class CompileError(Exception):
    """torch.compile failed on this case; recorded as status 'compile_error' with the first line."""


def is_compile_error(exc: BaseException) -> bool:
    """An exception raised by dynamo or inductor (a failed trace, a fullgraph break, a backend that
    could not compile), told apart from an error of the model itself by where its class lives."""
    if isinstance(exc, CompileError):
        return True
    return any(cls.__module__.startswith(("torch._dynamo", "torch._inductor")) for cls in type(exc).__mro__)


def compile_reason(exc: BaseException) -> str:
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    return f"{type(exc).__name__}: {first}"[:500]


def compile_model(model, case):
    """The model as the step will call it: compiled, or the model itself for an eager case."""
    import torch
    if not case.compiled:
        return model
    _reset()
    return torch.compile(model, mode=_mode_arg(case.compile_mode), backend=case.compile_backend,
                         fullgraph=case.compile_fullgraph)


def compile_optimizer_step(optimizer, case) -> None:
    """compile_optimizer: replace the optimizer's step with a compiled one (GradScaler.step and the
    plain step both call optimizer.step, so both get it)."""
    import torch
    if case.compiled and case.compile_optimizer:
        optimizer.step = torch.compile(optimizer.step, mode=_mode_arg(case.compile_mode), backend=case.compile_backend)


def _mode_arg(mode: str):
    return None if mode == "default" else mode


def _reset() -> None:
    """A fresh dynamo state for this case (the pytest fixture builds several cases in one process)."""
    import torch
    torch._dynamo.reset()
    from torch._dynamo import utils
    utils.counters.clear()
    if hasattr(utils, "clear_compilation_metrics"):  # guarded: private API, present in 2.11 and 2.14
        utils.clear_compilation_metrics()


class CompileWatch:
    """Dynamo's counters read at points of the run; every count in the row is a difference of two."""

    def snapshot(self) -> dict:
        from torch._dynamo import utils
        metrics = list(utils.get_compilation_metrics()) if hasattr(utils, "get_compilation_metrics") else []
        recompiles = [m for m in metrics if getattr(m, "recompile_reason", None)]
        return {
            "graphs": int(utils.counters["stats"].get("unique_graphs", 0)),
            "frames": int(utils.counters["frames"].get("ok", 0)) + int(utils.counters["frames"].get("total", 0)),
            "graph_breaks": dict(utils.counters["graph_break"]),
            "recompiles": len(recompiles),
            "recompile_reasons": [_first_line(m.recompile_reason) for m in recompiles],
        }

    @staticmethod
    def compiled_since(before: dict, after: dict) -> bool:
        """New graphs or frames: a compile (or recompile) happened between the two snapshots."""
        return after["graphs"] > before["graphs"] or after["frames"] > before["frames"]


def warm_up(case, step, inputs, target, losses: list, emit) -> dict:
    """warmup_steps steps, then for a compiled case more until SETTLE_STEPS steps in a row compiled
    nothing (at most MAX_SETTLE_STEPS more). Returns the compile columns for the row. A dynamo or
    inductor failure becomes CompileError."""
    if not case.compiled:
        for i in range(case.warmup_steps):
            losses.append(step(inputs, target))
            emit(i)
        return {}
    from amp_bench.measure.devices import for_device
    watch = CompileWatch()
    compile_s, first_ms, quiet, i = 0.0, None, 0, 0
    sync = for_device(step.device_type).synchronize  # 'cuda': the current device (run_case made it so)
    while i < case.warmup_steps or (quiet < SETTLE_STEPS and i < case.warmup_steps + MAX_SETTLE_STEPS):
        before = watch.snapshot()
        started = time.perf_counter()
        try:
            losses.append(step(inputs, target))
            sync()
        except Exception as exc:
            if is_compile_error(exc):
                raise CompileError(compile_reason(exc)) from exc
            raise
        seconds = time.perf_counter() - started
        if first_ms is None:
            first_ms = seconds * 1e3
        if watch.compiled_since(before, watch.snapshot()) or i == 0:
            compile_s += seconds  # the whole wall time of a step that compiled: what the user waits
            quiet = 0
        else:
            quiet += 1
        emit(i)
        i += 1
    after = watch.snapshot()
    breaks = after["graph_breaks"]
    return {
        "warmup_steps_run": i, "compile_settled": quiet >= SETTLE_STEPS, "compile_first_step_ms": first_ms,
        "compile_time_s": compile_s, "graph_breaks": int(sum(breaks.values())),
        "graph_break_reasons": " | ".join(_first_line(r) for r in list(breaks)[:REASONS_KEPT]),
        "unique_graphs": after["graphs"], "recompiles": after["recompiles"],
        "recompile_reasons": " | ".join(after["recompile_reasons"][:REASONS_KEPT]), "_compile_snapshot": after,
    }


def window_columns(record: dict, watch_after: dict) -> tuple[dict, str]:
    """After the window: recompiles (new compiled graphs or frames) inside it, and a warning when any."""
    before = record.pop("_compile_snapshot", None)
    if before is None:
        return {}, ""
    in_window = max(watch_after["recompiles"] - before["recompiles"], 0)
    new_graphs = max(watch_after["graphs"] - before["graphs"], 0)
    count = max(in_window, 1 if CompileWatch.compiled_since(before, watch_after) else 0)
    out = {"recompiles_in_window": count, "recompiles": watch_after["recompiles"],
           "unique_graphs": watch_after["graphs"]}
    warning = ""
    if count:
        reasons = watch_after["recompile_reasons"][before["recompiles"]:][:REASONS_KEPT]
        warning = (f"torch.compile recompiled inside the measured window ({count}x, {new_graphs} new graphs"
                   + (f": {'; '.join(reasons)}" if reasons else "") + "): those steps include compile time")
    return out, warning


def log_summary(columns: dict) -> None:
    """The counts and first reasons in the case's log (the worker's stdout)."""
    if not columns:
        return
    print(f"[amp_bench] compile: first step {columns['compile_first_step_ms']:.0f} ms, compile time "
          f"{columns['compile_time_s']:.2f} s, {columns['unique_graphs']} graphs, {columns['graph_breaks']} graph "
          f"breaks, {columns['recompiles']} recompiles, settled={columns['compile_settled']}", flush=True)
    for label in ("graph_break_reasons", "recompile_reasons"):
        if columns.get(label):
            print(f"[amp_bench] compile {label}: {columns[label]}", flush=True)


def _first_line(text: str) -> str:
    """The first line, its runs of spaces collapsed (dynamo aligns guard text into columns)."""
    return " ".join(str(text).strip().splitlines()[0].split())[:200] if str(text).strip() else ""
