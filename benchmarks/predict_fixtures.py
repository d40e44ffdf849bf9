"""Builds the small run directories tests/data/predict/ holds for `predict` (sources in its README).

    python benchmarks/predict_fixtures.py cpu RUN_DIR          # a CPU run of suites/smoke.yaml: its resnet18 case
    python benchmarks/predict_fixtures.py gpu TRACE.json.gz    # HTA's tests/data/timeline_analysis/sampled_rank-0
    python benchmarks/predict_fixtures.py optimizers OUT_DIR   # a real CPU step per AdamW form (loop, foreach, fused)

Traces keep only what `predict` reads (the step's CPU ops and annotations with their shapes, types and
concrete inputs; kernels, copies and launches with their correlation ids and grids); results.csv keeps
the columns it reads.
"""
from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "predict"
CATS = ("cpu_op", "user_annotation", "kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime")
ARGS = ("Input Dims", "Input type", "Concrete Inputs", "Input Strides", "correlation", "grid", "bytes")
COLUMNS = ["run_id", "case_id", "model", "model_label", "batch_size", "precision", "channels_last", "image_size",
           "seq_len", "device", "device_name", "world_size", "repeat", "status", "reason", "step_time_ms_median",
           "throughput", "tf32_matmul", "tf32_cudnn", "compile_mode", "explain_status", "explain_trace"]


def trim_trace(events: list[dict], start: float | None = None, end: float | None = None) -> dict:
    """The events predict reads, with only the args it reads, optionally inside [start, end]."""
    out = []
    for e in events:
        if e.get("ph") != "X" or e.get("cat") not in CATS:
            continue
        if start is not None and not (start - 1 <= float(e["ts"]) <= end):
            continue
        args = {k: v for k, v in (e.get("args") or {}).items() if k in ARGS}
        out.append({k: e[k] for k in ("ph", "cat", "name", "pid", "tid", "ts", "dur") if k in e}
                   | ({"args": args} if args else {}))
    return {"traceEvents": out}


def _write(trace: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.GzipFile(path, "wb", compresslevel=9, mtime=0) as fh:
        fh.write(json.dumps(trace, separators=(",", ":")).encode())


def cpu(run_dir: str) -> None:
    """tests/data/predict/cpu_run/ from a CPU run of suites/smoke.yaml: its resnet18 case, repeat 0."""
    run = Path(run_dir)
    rows = pd.read_csv(run / "results.csv")
    rows = rows[(rows["model_label"] == "resnet18") & (rows["repeat"] == 0)]  # every column: the report reads them
    samples = pd.read_csv(run / "samples.csv")
    out = DATA / "cpu_run"
    first = samples["case_id"].isin(rows["case_id"]) & (samples["repeat"] == 0)
    samples[first].to_csv(out / "samples.csv", index=False)
    for trace in rows["explain_trace"].dropna():
        _write(trim_trace(json.loads(gzip.decompress((run / trace).read_bytes()))["traceEvents"]), out / trace)
    rows.to_csv(out / "results.csv", index=False)
    (out / "suite.yaml").write_text((run / "suite.yaml").read_text() + "predict:\n  targets: [h100-sxm, a100-80gb, l4, "
                                                                        "v100-sxm2]\n")
    print(f"{out}: {len(rows)} rows")


def gpu(trace_file: str) -> None:
    """tests/data/predict/gpu_run/ from HTA's sampled_rank-0 trace: its first ProfilerStep as a one-row run."""
    events = json.loads(gzip.decompress(Path(trace_file).read_bytes()))["traceEvents"]
    step = next(e for e in events if str(e.get("name", "")).startswith("ProfilerStep#"))
    trace = trim_trace(events, step["ts"], step["ts"] + step["dur"] + 2e5)  # + the kernels still queued at its end
    out = DATA / "gpu_run"
    _write(trace, out / "traces" / "sampled_rank-0-tf32-r0.json.gz")
    row = {"run_id": "hta-sampled-rank-0", "case_id": "hta-recsys-tf32", "model": "unknown",
           "model_label": "hta-recsys",
           "batch_size": 1, "precision": "tf32", "channels_last": False, "device": "cuda",
           "device_name": "NVIDIA A100-PG509-200", "world_size": 1, "repeat": 0, "status": "ok",
           "step_time_ms_median": step["dur"] / 1e3, "tf32_matmul": True, "tf32_cudnn": True, "compile_mode": "eager",
           "explain_status": "ok", "explain_trace": "traces/sampled_rank-0-tf32-r0.json.gz"}
    pd.DataFrame([row]).reindex(columns=COLUMNS).to_csv(out / "results.csv", index=False)
    print(f"{out}: {len(trace['traceEvents'])} events")


def _adamw_step(impl: str, path: Path) -> None:
    """One training step of a 256-512-10 MLP (batch 32) with AdamW in `impl` form, profiled with shapes as
    explain profiles (an amp_bench::step region), after two unprofiled steps that create its state."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    form = {"fused": {"fused": True}, "foreach": {"foreach": True}, "for-loop": {"foreach": False}}[impl]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, **form)
    x, y = torch.randn(32, 256), torch.randint(0, 10, (32,))

    def step():
        optimizer.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    step(), step()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof, record_function("amp_bench::step"):
        step()
    raw = path.with_suffix(".raw.json")
    prof.export_chrome_trace(str(raw))
    _write(trim_trace(json.loads(raw.read_text())["traceEvents"]), path)
    raw.unlink()


def optimizers(out_dir: str) -> None:
    """tests/data/predict/optimizer_steps/: a real CPU step with each form of AdamW, for the inventory tests."""
    import torch
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for impl in ("for-loop", "foreach", "fused"):
        _adamw_step(impl, out / f"adamw-{impl}.json.gz")
    print(f"{out}: three AdamW steps (torch {torch.__version__})")


if __name__ == "__main__":
    {"cpu": cpu, "gpu": gpu, "optimizers": optimizers}[sys.argv[1]](sys.argv[2])
