"""How changepoints.state's bars (Z_TAIL, T_DF, TEST_FLOOR) were chosen: each candidate is run
through nightly_targets.detection_rates and its figures printed, to pick by the targets.

    python benchmarks/calibrate_state.py [--trials 200] [--noise-series 2000]

The chosen set (the module's defaults) had the fewest pure-noise and shared-machine alarms among
those that caught every 10% step within 2 nights and >= 95% of 5% steps within 3; no candidate met
3% within 5 nights >= 90% together with pure noise <= 0.1% (see docs/nightly.md).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from nightly_targets import detection_rates

import amp_bench.analysis.gate.changepoints as cp

CANDIDATES = [  # (Z_TAIL, T_DF, TEST_FLOOR)
    ((4.3, 4.3, 3.9), 2.0, 0.25),
    ((4.7, 4.3, 3.8), 2.0, 0.25),
    ((5.0, 4.5, 4.0), 2.0, 0.25),
    ((4.3, 4.3, 3.9), 1.0, 0.25),
    ((4.3, 4.3, 3.9), 4.0, 0.25),
    ((4.3, 4.3, 3.9), 2.0, 0.10),
]
KEYS = ("step10_within_2", "step5_within_3", "step3_within_5", "noise_ever_red", "spike_ever_red",
        "fixed_green_within_2", "bimodal_tree_ever_red", "drift_before_5pct")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--noise-series", type=int, default=2000)
    args = parser.parse_args()
    print("Z_TAIL            T_DF floor  " + " ".join(k.split("_")[0][:7].rjust(7) for k in KEYS))
    for z_tail, t_df, floor in CANDIDATES:
        cp.Z_TAIL, cp.T_DF, cp.TEST_FLOOR = z_tail, t_df, floor
        r = detection_rates(args.trials, noise_series=args.noise_series)
        print(f"{str(z_tail):<17} {t_df:4.1f} {floor:5.2f}  " + " ".join(f"{r[k]:7.1%}" for k in KEYS), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
