"""The nightly gate's targets, measured on generated series and generated results trees.

    python benchmarks/nightly_targets.py [--trials 400] [--fleet-nights 365] [--skip-fleet]

Its generators are its own (not the tests'): a night's value is the median of 3 repeats x 20 steps
(per-step noise 2%, per-repeat 0.5%) times a night-to-night factor (1% unless said), 30 nights,
changes at night 21. Each series is judged night by night, as cron would run the gate.
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from amp_bench.analysis.gate.changepoints import state

NIGHTS, AT = 30, 20


def nights(rng, n=NIGHTS, night_noise=0.01):
    """Per-night medians of 3 repeats x 20 steps, with night-to-night noise."""
    steps = rng.normal(1.0, 0.02, (n, 3, 20)) * rng.normal(1.0, 0.005, (n, 3, 1))
    return 100 * np.median(np.median(steps, axis=2), axis=1) * np.exp(rng.normal(0, night_noise, n))


def red_nights(values, first=6):
    return [i - 1 for i in range(first, len(values) + 1) if state(values[:i]).red]


def detection_rates(trials: int = 400, seed: int = 0, noise_series: int = 0,
                    only: set[str] | None = None) -> dict[str, float]:
    """noise_series: how many pure-noise series measure the false-alarm rate (default 3 per trial;
    a 0.1% rate needs thousands). only: the rates to judge (default all; the shared-machine one is always
    judged); every series is drawn either way, so a rate is the same figure whichever others are asked for."""
    rng = np.random.default_rng(seed)
    out: dict[str, list] = {k: [] for k in ("step10_within_2", "step5_within_3", "step5_dated", "step3_within_5",
                                            "noise_ever_red", "spike_ever_red", "spike_red_at_spike",
                                            "fixed_green_within_2",
                                            "spike2_green_within_2", "bimodal_tree_ever_red", "drift_before_5pct")}
    wanted = (lambda *keys: only is None or bool(set(keys) & only))
    for _ in range(trials):
        for key, size, within in (("step10_within_2", 0.10, 2), ("step5_within_3", 0.05, 3),
                                  ("step3_within_5", 0.03, 5)):
            v = nights(rng)
            v[AT:] *= 1 + size
            if not wanted(key, "step5_dated" if key == "step5_within_3" else key):
                continue
            hits = [i for i in range(AT + 1, AT + within + 1) if state(v[:i]).red]
            out[key].append(bool(hits))
            if key == "step5_within_3":
                out["step5_dated"].append(bool(hits) and state(v[:hits[0]]).start == AT)
        for _ in range(0 if noise_series else 3):
            v = nights(rng)
            if wanted("noise_ever_red"):
                out["noise_ever_red"].append(bool(red_nights(v)))
        v = nights(rng)
        v[AT] *= 1.2
        if wanted("spike_ever_red", "spike_red_at_spike"):
            red = red_nights(v)
            out["spike_ever_red"].append(bool(red))
            out["spike_red_at_spike"].append(any(i in red and i - 1 not in red for i in (AT, AT + 1)))
        for key, length, size in (("fixed_green_within_2", 6, 0.05), ("spike2_green_within_2", 2, 0.2)):
            v = nights(rng)
            v[AT:AT + length] *= 1 + size
            back = AT + length  # first night at the old level
            if wanted(key):
                out[key].append(not [i for i in red_nights(v) if i >= back + 1])
        slow = rng.random(NIGHTS) < 0.3  # a shared machine: 30% of nights 4% slower, all cases alike
        # judged whatever is asked: how many series it draws depends on what it finds
        out["bimodal_tree_ever_red"].append(any(red_nights(nights(rng) * np.where(slow, 1.04, 1.0)) for _ in range(3)))
        v = nights(rng)
        v *= 1 + 0.005 * np.clip(np.arange(NIGHTS) - (AT - 10) + 1, 0, None)  # +0.5%/night from night 11
        if wanted("drift_before_5pct"):
            first = next(iter(red_nights(v)), None)
            out["drift_before_5pct"].append(first is not None and 0.005 * (first - (AT - 10) + 1) < 0.05)
    noise_rng = np.random.default_rng(seed + 1)
    if wanted("noise_ever_red"):
        out["noise_ever_red"] += [bool(red_nights(nights(noise_rng))) for _ in range(noise_series)]
    rates = {k: float(np.mean(v)) for k, v in out.items() if v}
    rates["noise_series"] = float(len(out["noise_ever_red"]))
    return rates


def write_tree(root: Path, machines: int, suites: int, cases: int, n_nights: int, rng, changes=None,
               steps: int = 5) -> None:
    """A results tree as `amp_bench run` writes it (results.csv, samples.csv, manifest.json), plain
    CSV writing for speed. changes: {(machine, case): (night, factor)}."""
    changes = changes or {}
    header = ("run_id,suite,case_id,status,device,device_name,batch_size,repeat,hostname,fingerprint,timestamp,"
              "step_time_ms_median,throughput,peak_mem_allocated_bytes\n")
    for night in range(n_nights):
        day = np.datetime64("2026-01-01") + night
        for m in range(machines):
            for s in range(suites):
                run_id = f"{str(day).replace('-', '')}T02{s:02d}00Z-node{m:02d}-cuda"
                d = root / run_id
                d.mkdir(parents=True)
                rows, samples = [header], ["run_id,case_id,precision,repeat,phase,step,step_time_ms,loss\n"]
                level = nights(rng, 1)[0] / 100
                for c in range(cases):
                    case = f"suite{s}-case{c:02d}"
                    night_at, factor = changes.get((m, case), (n_nights, 1.0))
                    base = (20 + c) * level * (factor if night >= night_at else 1.0)
                    for r in range(3):
                        t = base * rng.normal(1, 0.01, steps)
                        med = float(np.median(t))
                        rows.append(f"{run_id},suite{s},{case},ok,cuda,H200,64,{r},node{m:02d},fp{m:02d},"
                                    f"{day}T02:{s:02d}:00+00:00,{med:.4f},{64000 / med:.3f},{int(2e9 + c * 1e6)}\n")
                        samples += [f"{run_id},{case},amp_bf16,{r},measure,{i},{x:.4f},\n" for i, x in enumerate(t)]
                (d / "results.csv").write_text("".join(rows))
                (d / "samples.csv").write_text("".join(samples))
                (d / "manifest.json").write_text(f'{{"run_id": "{run_id}", "status": "complete"}}\n')


def annotation_clears(trees: int = 20, seed: int = 1) -> float:
    """Share of trees whose regression an annotation dated the night of the change clears."""
    from amp_bench.analysis.gate.history import evaluate, load_annotations
    from amp_bench.store.cache import load_tree
    rng = np.random.default_rng(seed)
    cleared = 0
    for _ in range(trees):
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            write_tree(root, 1, 1, 3, NIGHTS, rng, changes={(0, "suite0-case01"): (AT, 1.06)})
            results = load_tree(root)
            red_before = bool(evaluate(results).red)
            path = root / "annotations.yaml"
            path.write_text(f"- {{from: 2026-01-{AT + 1:02d}, machine: node00, note: new driver}}\n")
            after = evaluate(results, load_annotations(path), annotations_path=path)
            cleared += red_before and not after.red and not after.warnings
    return cleared / trees


def fleet_timing(n_nights: int, cases: int = 15) -> dict[str, float]:
    from amp_bench.analysis.gate.history import evaluate
    from amp_bench.store.cache import load_tree
    rng = np.random.default_rng(2)
    root = Path(tempfile.mkdtemp(prefix="amp_bench_fleet_"))
    try:
        start = time.perf_counter()
        write_tree(root, 10, 3, cases, n_nights, rng, changes={(3, "suite1-case04"): (n_nights - 4, 1.07)})
        written = time.perf_counter() - start
        timings = {"runs": float(len(list(root.iterdir()))), "write_s": written}
        for label in ("cold", "warm"):
            start = time.perf_counter()
            result = evaluate(load_tree(root))
            timings[f"history_{label}_s"] = time.perf_counter() - start
        timings["series"] = float(len(result.states) / 3)
        timings["red"] = float(len({(s.fingerprint, s.case_id) for s in result.red}))
        return timings
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=400)
    parser.add_argument("--noise-series", type=int, default=3000,
                        help="pure-noise series for the false-alarm rate (0: 3 per trial)")
    parser.add_argument("--fleet-nights", type=int, default=365)
    parser.add_argument("--fleet-cases", type=int, default=15, help="cases per suite in the fleet tree")
    parser.add_argument("--skip-fleet", action="store_true")
    args = parser.parse_args()
    r = detection_rates(args.trials, noise_series=args.noise_series)
    rows = [("10% step: red within 2 nights", r["step10_within_2"], ">= 100%"),
            ("5% step: red within 3 nights", r["step5_within_3"], ">= 95%"),
            ("5% step: dated to the night it began", r["step5_dated"], "-"),
            ("3% step: red within 5 nights", r["step3_within_5"], ">= 90%"),
            (f"pure noise: 30-night series ever red ({r['noise_series']:.0f} series)", r["noise_ever_red"], "<= 0.1%"),
            ("one-night +20% spike: series ever red (anywhere in 30 nights)", r["spike_ever_red"], "-"),
            ("one-night +20% spike: red at the spike (green the night before)", r["spike_red_at_spike"], "0%"),
            ("+5% fixed after 6 nights: green from 2 nights after the return", r["fixed_green_within_2"], "100%"),
            ("two-night +20% spike: green from 2 nights after the return", r["spike2_green_within_2"], "100%"),
            ("30% of nights 4% slower: 3-case trees ever red", r["bimodal_tree_ever_red"], "<= 5%"),
            ("drift +0.5%/night: red before the cumulative 5%", r["drift_before_5pct"], ">= 90%")]
    print(f"detection ({args.trials} trials each, 30 nights, 1% night noise):")
    for label, value, target in rows:
        print(f"  {label:<66} {value:7.1%}   target {target}")
    print(f"  {'annotation dated the night of a change: trees cleared':<66} {annotation_clears():7.1%}   target 100%")
    if not args.skip_fleet:
        t = fleet_timing(args.fleet_nights, args.fleet_cases)
        print(f"fleet: {t['runs']:.0f} run directories (10 machines x 3 suites x {args.fleet_nights} nights, "
              f"{args.fleet_cases} cases x 3 repeats each, with samples), {t['series']:.0f} series")
        print(f"  history cold (CSV read, cache built): {t['history_cold_s']:.1f} s; warm: {t['history_warm_s']:.1f} s "
              f"(target < 30 s); red series: {t['red']:.0f} (1 planted)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
