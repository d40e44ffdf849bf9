"""Harness overhead: amp_bench's worker vs a plain hand-written AMP loop, side by side.

Both run the same workload in fresh processes, alternating harness/plain so machine drift hits
both: the harness's worker forked from a fork server as a run's workers are (its imports done once,
before the first round), the plain loop a fresh interpreter as a user's script is. By default on the
CPU: torchvision resnet18, weights=None, 64 px, batch 16, SGD foreach. The comparison is wall-clock
window throughput (samples over the synchronised window, the harness row's `throughput`): that is
where a harness's host-side cost shows. Median step times (CUDA events on a
GPU) are printed beside it, but on a GPU-bound model they agree by construction. The GPU check runs
its own ResNet-50 case this way, so the summary puts suite, harness and plain loop side by side.
Prints each round's throughputs, the ratio of the medians, and the median of the per-round (paired)
ratios plain / harness, which is the headline: on a shared 2-core VM a single process can run
10-20% slow, and pairing neighbouring rounds cancels that drift. Also prints the share of the
harness's measured window spent on its own work between steps, a noise-free figure. --csv writes
one row per round. Exits 1 when the paired ratio is above the target, 2 when a side failed to run.

    python benchmarks/overhead.py [--rounds 5] [--steps 30] [--precision amp_bf16] [--target 1.02]
    python benchmarks/overhead.py --device cuda --model resnet50 --image-size 224 --batch 64 \
        --channels-last --optimizer adamw --impl fused --rounds 2 --csv overhead.csv
"""
from __future__ import annotations

import argparse
import csv
import json
import statistics
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

GAPS: list[float] = []  # share of each harness window spent between steps (its own per-step work)


@dataclass(frozen=True)
class Workload:
    device: str = "cpu"
    model: str = "resnet18"
    image_size: int = 64
    batch: int = 16
    channels_last: bool = False
    optimizer: str = "sgd"  # sgd (lr 0.01, momentum 0.9) or adamw (lr 1e-4, weight decay 0.01)
    impl: str = "foreach"  # foreach or fused

    def hyper(self) -> dict:
        return {"lr": 0.01, "momentum": 0.9, "weight_decay": 0.0} if self.optimizer == "sgd" else \
            {"lr": 1e-4, "momentum": 0.0, "weight_decay": 0.01}


def plain_loop(precision: str, warmup: int, steps: int, work: Workload = Workload()) -> tuple[float, float]:
    """What a user writes by hand: autocast around forward+loss, GradScaler for fp16. Returns (median
    step ms, wall-clock samples/s over the window, bracketed by synchronisations like the harness's)."""
    import time

    import torch
    import torchvision

    torch.manual_seed(0)
    device = torch.device(work.device)
    cuda = device.type == "cuda"
    if cuda:  # the harness's setting for these modes: cuDNN autotuning, strict FP32 outside autocast
        torch.backends.cudnn.benchmark = True
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    layout = torch.channels_last if work.channels_last else torch.contiguous_format
    model = torchvision.models.get_model(work.model, weights=None).to(device, memory_format=layout).train()
    h = work.hyper()
    kind = {"fused": True} if work.impl == "fused" else {"foreach": True}
    optimizer = (torch.optim.SGD(model.parameters(), lr=h["lr"], momentum=h["momentum"], **kind)
                 if work.optimizer == "sgd" else
                 torch.optim.AdamW(model.parameters(), lr=h["lr"], weight_decay=h["weight_decay"], **kind))
    dtype = {"amp_bf16": torch.bfloat16, "amp_fp16": torch.float16}.get(precision)
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
    images = torch.randn(work.batch, 3, work.image_size, work.image_size, device=device)
    images = images.contiguous(memory_format=layout)
    labels = torch.randint(0, 1000, (work.batch,), device=device)
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(steps)] if cuda else []
    times = []
    window_start = None
    for i in range(warmup + steps):
        if i == warmup:
            if cuda:
                torch.cuda.synchronize()
            window_start = time.perf_counter()
        start = time.perf_counter()
        if cuda and i >= warmup:
            events[i - warmup][0].record()
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            loss = torch.nn.functional.cross_entropy(model(images), labels)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        if cuda and i >= warmup:
            events[i - warmup][1].record()
        elif i >= warmup:
            times.append((time.perf_counter() - start) * 1e3)
    if cuda:
        torch.cuda.synchronize()
        times = [begin.elapsed_time(end) for begin, end in events]
    window_s = time.perf_counter() - window_start
    return statistics.median(times), work.batch * steps / window_s


def harness_round(precision: str, warmup: int, steps: int, workdir: Path, device: dict,
                  work: Workload = Workload(), server=None) -> tuple[float, float]:
    from amp_bench.launchers.forkserver import launch
    from amp_bench.platform.device import DeviceInfo, precision_support
    from amp_bench.suite import Case, ModelSpec, OptimizerSpec

    h = work.hyper()
    case = Case(suite="overhead", model=ModelSpec(ref=f"torchvision/{work.model}", label=work.model),
                batch_size=work.batch, precision=precision, channels_last=work.channels_last,
                image_size=work.image_size, seq_len=None, warmup_steps=warmup, steps=steps, repeats=1,
                optimizer=OptimizerSpec(work.optimizer, work.impl, h["lr"], h["momentum"], h["weight_decay"]),
                seed=0, timeout_s=600, allow_emulated=True)
    spec, result = workdir / "spec.json", workdir / "result.json"
    support = precision_support(precision, DeviceInfo.from_json(device))  # the gate, decided here as a run does
    spec.write_text(json.dumps({"case": case.to_json(), "device": device, "support": asdict(support)}))
    outcome = launch(["case", str(spec), str(result)], result, workdir / "worker.log", case.timeout_s, server=server)
    if not outcome.result or outcome.result.get("status") != "ok":
        tail = (workdir / "worker.log").read_text(errors="replace").splitlines()[-15:]
        print(f"harness worker failed: {outcome.result}\n" + "\n".join(tail), file=sys.stderr)
        raise SystemExit(2)
    GAPS.append(outcome.result["window_gap_fraction"])
    return outcome.result["step_time_ms_median"], outcome.result["throughput"]


def plain_round(precision: str, warmup: int, steps: int, work: Workload = Workload()) -> tuple[float, float]:
    code = (f"import sys; sys.path.insert(0, {str(ROOT / 'benchmarks')!r}); import overhead; "
            f"print(overhead.plain_loop({precision!r}, {warmup}, {steps}, overhead.Workload(**{asdict(work)!r})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if out.returncode:
        print(f"plain loop failed:\n{out.stderr[-3000:]}", file=sys.stderr)
        raise SystemExit(2)
    median_ms, throughput = out.stdout.strip().splitlines()[-1].strip("()").split(",")
    return float(median_ms), float(throughput)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--precision", default="amp_bf16", choices=("fp32", "amp_bf16", "amp_fp16"))
    parser.add_argument("--target", type=float, default=1.02)
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    parser.add_argument("--model", default="resnet18", help="a torchvision model name")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--channels-last", action="store_true")
    parser.add_argument("--optimizer", default="sgd", choices=("sgd", "adamw"))
    parser.add_argument("--impl", default="foreach", choices=("foreach", "fused"))
    parser.add_argument("--csv", type=Path, help="write one row per round here")
    args = parser.parse_args()
    work = Workload(args.device, args.model, args.image_size, args.batch, args.channels_last, args.optimizer, args.impl)
    harness, plain, rows = [], [], []  # samples/s over each round's wall-clock window
    # probe once, in a worker, so this process never runs torch work (its thread pool would
    # compete with the measured process for the cores)
    from amp_bench.launchers.forkserver import ForkServer
    from amp_bench.store.columns import STUDY_TABLES
    from amp_bench.studies.session import probe
    from amp_bench.suite.model_refs import preload_modules
    device = probe(args.device)["device"]
    server = ForkServer.start(preload_modules([f"torchvision/{work.model}"]))
    with tempfile.TemporaryDirectory() as tmp, server:
        for i in range(args.rounds):
            harness_ms, harness_rate = harness_round(args.precision, args.warmup, args.steps, Path(tmp), device, work,
                                                     server)
            plain_ms, plain_rate = plain_round(args.precision, args.warmup, args.steps, work)
            harness.append(harness_rate)
            plain.append(plain_rate)
            print(f"round {i + 1}: harness {harness_rate:.1f} samples/s ({harness_ms:.2f} ms/step median)   "
                  f"plain loop {plain_rate:.1f} samples/s ({plain_ms:.2f} ms/step median)", flush=True)
            rows.append({"round": i + 1, **asdict(work), "device_name": device.get("name", ""),
                         "precision": args.precision, "warmup": args.warmup, "steps": args.steps,
                         "harness_throughput": harness_rate, "plain_throughput": plain_rate,
                         "ratio": plain_rate / harness_rate, "harness_ms": harness_ms, "plain_ms": plain_ms,
                         "harness_gap_fraction": GAPS[-1], "target": args.target})
            if args.csv:  # after every round: a run stopped early keeps what it measured
                with open(args.csv, "w", newline="", encoding="utf-8") as fh:  # columns as the store declares them
                    writer = csv.DictWriter(fh, fieldnames=list(STUDY_TABLES["overhead"]))
                    writer.writeheader()
                    writer.writerows(rows)
    ratio = statistics.median(plain) / statistics.median(harness)
    paired = statistics.median(p / h for h, p in zip(harness, plain, strict=True))
    print(f"{work.model} {work.image_size}px batch {work.batch} {args.precision} on {device.get('name', args.device)}, "
          f"{args.rounds} rounds x {args.steps} steps: harness {statistics.median(harness):.1f} samples/s, "
          f"plain loop {statistics.median(plain):.1f} samples/s (wall-clock windows; ratio of medians {ratio:.3f})")
    print(f"overhead ratio plain / harness throughput (median of paired per-round ratios): {paired:.3f} "
          f"(target <= {args.target}); "
          f"the harness's own work between steps: {statistics.median(GAPS):.3%} of its measured windows")
    return 0 if paired <= args.target else 1


if __name__ == "__main__":
    sys.exit(main())
