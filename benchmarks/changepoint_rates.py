"""Detection and false-alarm rates of amp_bench's change-point detector on series with known truth.

    python benchmarks/changepoint_rates.py [--trials 1000]

Prints: how often a 5% step change after 20 runs (1% noise) is confirmed within 2 runs of the change;
the false-alarm rate per run on 200 runs of pure noise; and whether a single-run spike that reverses
ever raises an alarm.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from amp_bench.changepoints import detect  # noqa: E402


def step_change_detected(rng, change_at=20, length=40, shift=0.05, noise=0.01) -> bool:
    series = rng.normal(1.0, noise, length)
    series[change_at:] += shift
    changes = detect(series)
    return any(change_at <= c.index <= change_at + 2 and c.confirmed_at <= change_at + 2 for c in changes)


def false_alarms(rng, length=200, noise=0.01) -> int:
    return len(detect(rng.normal(1.0, noise, length)))


def spike_alarms(rng, length=40, at=20, size=0.2, noise=0.01) -> int:
    """Alarms raised around a one-run +20% spike (elsewhere they would be plain false alarms)."""
    series = rng.normal(1.0, noise, length)
    series[at] *= 1 + size
    return sum(1 for c in detect(series) if at - 2 <= c.index <= at + 2)


def rates(trials: int, seed: int = 0) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    detected = sum(step_change_detected(rng) for _ in range(trials)) / trials
    alarms_per_run = sum(false_alarms(rng) for _ in range(trials)) / (trials * 200)
    spikes = sum(spike_alarms(rng) for _ in range(trials))
    return {"detection_within_2_runs": detected, "false_alarms_per_run": alarms_per_run, "spike_alarms": spikes}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=1000)
    args = parser.parse_args()
    r = rates(args.trials)
    print(f"5% step after 20 runs, 1% noise: confirmed within 2 runs in {r['detection_within_2_runs']:.1%} "
          f"of {args.trials} trials (target >= 95%)")
    print(f"200 runs of pure 1% noise: {r['false_alarms_per_run']:.3%} false alarms per run (target <= 1%)")
    print(f"single-run +20% spike that reverses: {r['spike_alarms']} alarms in {args.trials} trials (target 0)")
    ok = r["detection_within_2_runs"] >= 0.95 and r["false_alarms_per_run"] <= 0.01 and r["spike_alarms"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
