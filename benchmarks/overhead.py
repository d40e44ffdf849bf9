"""Harness overhead: amp_bench's worker vs a plain hand-written AMP loop, side by side.

Both run the same CPU workload (torchvision resnet18, weights=None, 64 px, batch 16, SGD foreach)
in fresh processes, alternating harness/plain so machine drift hits both. Prints each round's
median step time, the ratio of the two medians, and the median of the per-round (paired) ratios,
which is the headline: on a shared 2-core VM a single process can run 10-20% slow, and pairing
neighbouring rounds cancels that drift. Also prints the share of the harness's measured window
spent on its own work between steps, a noise-free figure. Exits 1 when the paired ratio is above
the target.

    python benchmarks/overhead.py [--rounds 5] [--steps 30] [--precision amp_bf16] [--target 1.02]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MODEL, IMAGE_SIZE, BATCH = "resnet18", 64, 16
GAPS: list[float] = []  # share of each harness window spent between steps (its own per-step work)


def plain_loop(precision: str, warmup: int, steps: int) -> float:
    """What a user writes by hand: autocast around forward+loss, GradScaler for fp16."""
    import time

    import torch
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.get_model(MODEL, weights=None).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, foreach=True)
    dtype = {"amp_bf16": torch.bfloat16, "amp_fp16": torch.float16}.get(precision)
    scaler = torch.amp.GradScaler("cpu", enabled=dtype == torch.float16)
    images = torch.randn(BATCH, 3, IMAGE_SIZE, IMAGE_SIZE)
    labels = torch.randint(0, 1000, (BATCH,))
    times = []
    for i in range(warmup + steps):
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            loss = torch.nn.functional.cross_entropy(model(images), labels)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        if i >= warmup:
            times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def harness_round(precision: str, warmup: int, steps: int, workdir: Path, device: dict) -> float:
    from amp_bench.process import run_worker
    from amp_bench.suite import Case, ModelSpec, OptimizerSpec

    case = Case(suite="overhead", model=ModelSpec(ref=f"torchvision/{MODEL}", label=MODEL), batch_size=BATCH,
                precision=precision, channels_last=False, image_size=IMAGE_SIZE, seq_len=None, warmup_steps=warmup,
                steps=steps, repeats=1, optimizer=OptimizerSpec("sgd", "foreach", 0.01, 0.9), seed=0,
                timeout_s=600, allow_emulated=True)
    spec, result = workdir / "spec.json", workdir / "result.json"
    spec.write_text(json.dumps({"case": case.to_json(), "device": device}))
    outcome = run_worker(["case", str(spec), str(result)], result, workdir / "worker.log", case.timeout_s)
    if not outcome.result or outcome.result.get("status") != "ok":
        raise SystemExit(f"harness worker failed: {outcome.result} (log: {workdir / 'worker.log'})")
    GAPS.append(outcome.result["window_gap_fraction"])
    return outcome.result["step_time_ms_median"]


def plain_round(precision: str, warmup: int, steps: int) -> float:
    code = (f"import sys; sys.path.insert(0, {str(ROOT / 'benchmarks')!r}); import overhead; "
            f"print(overhead.plain_loop({precision!r}, {warmup}, {steps}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--precision", default="amp_bf16", choices=("fp32", "amp_bf16", "amp_fp16"))
    parser.add_argument("--target", type=float, default=1.02)
    args = parser.parse_args()
    harness, plain = [], []
    # probe once, in a worker, so this process never runs torch work (its thread pool would
    # compete with the measured process for the cores)
    from amp_bench.session import probe
    device = probe("cpu")["device"]
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):
            harness.append(harness_round(args.precision, args.warmup, args.steps, Path(tmp), device))
            plain.append(plain_round(args.precision, args.warmup, args.steps))
            print(f"round {i + 1}: harness {harness[-1]:.2f} ms/step   plain loop {plain[-1]:.2f} ms/step", flush=True)
    ratio = statistics.median(harness) / statistics.median(plain)
    paired = statistics.median(h / p for h, p in zip(harness, plain))
    print(f"{MODEL} {IMAGE_SIZE}px batch {BATCH} {args.precision} on CPU, {args.rounds} rounds x {args.steps} steps: "
          f"harness median {statistics.median(harness):.2f} ms, plain median {statistics.median(plain):.2f} ms "
          f"(ratio of medians {ratio:.3f})")
    print(f"overhead ratio (median of paired per-round ratios): {paired:.3f} (target <= {args.target}); "
          f"the harness's own work between steps: {statistics.median(GAPS):.3%} of its measured windows")
    return 0 if paired <= args.target else 1


if __name__ == "__main__":
    sys.exit(main())
