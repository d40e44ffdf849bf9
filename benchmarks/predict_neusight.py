"""Cross-GPU FP32 scoring of amp_bench's scaling rules on NeuSight's public per-op training labels.

    python benchmarks/predict_neusight.py extract --repo /path/to/NeuSight.git   # writes the fixture
    python benchmarks/predict_neusight.py fractions --repo ...  # gpu_specs.MEASURED_FRACTIONS, recomputed
    python benchmarks/predict_neusight.py dev      # the development set (inference labels): interval factors
    python benchmarks/predict_neusight.py predict  # freezes the held-out predictions (training labels)
    python benchmarks/predict_neusight.py score    # scores the frozen predictions against the measured labels

Data: NeuSight (Lee, Phanishayee, Mahajan, ASPLOS'25; github.com/sitar-lab/NeuSight, MIT licence),
scripts/asplos/label/<GPU>/<model>-<train|inf>-<seq>-<batch>.csv (per-op forward, backward and weight-
gradient accumulation times in ms, FP32 with TF32 off, with input shapes) and .json (the measured
end-to-end latency). `extract` keeps the columns used here, gzipped, under tests/data/predict/.
Protocol: the inference labels are the development set (checking the pipeline, setting the interval
factors in amp_bench/analysis/predict/model.py); the training labels are scored once, from predictions
written to docs/predict/neusight_predictions.csv.gz and committed before the scoring commit.
"""
from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from amp_bench.analysis.predict import neusight

DATA = ROOT / "tests" / "data" / "predict"
LABELS, E2E = DATA / "neusight_labels.csv.gz", DATA / "neusight_e2e.csv"
PREDICTIONS = ROOT / "docs" / "predict" / "neusight_predictions.csv.gz"
FROZEN = ["workload", "source", "target", "idx", "name", "phase", "category", "rule", "source_ms", "model_ms",
          "roofline_ms", "same_ms"]


def _git(repo: str, *args: str) -> str:
    return subprocess.run(["git", "--git-dir", repo, *args], capture_output=True, text=True, check=True).stdout


def extract(repo: str) -> None:
    """The label CSVs of the GPUs in amp_bench's spec table, trimmed to the columns used."""
    names = _git(repo, "ls-tree", "-r", "--name-only", "HEAD", "scripts/asplos/label").split("\n")
    kept, skipped = neusight.select_labels([n for n in names if n])
    frames, e2e, pointers = [], [], []
    for name, gpu, stem in kept:
        text = _git(repo, "show", f"HEAD:{name}")
        if not text.startswith("op,"):
            pointers.append(name)  # a large file the mirror holds as a pointer
            continue
        meta = json.loads(_git(repo, "show", f"HEAD:{name[:-4]}.json"))
        frames.append(neusight.trim(pd.read_csv(io.StringIO(text)), gpu, stem))
        e2e.append({"gpu": gpu, "workload": stem, "num_layer": meta["num_layer"], "e2e_ms": meta["e2e_latency"]})
    DATA.mkdir(parents=True, exist_ok=True)
    pd.concat(frames).to_csv(LABELS, index=False, compression={"method": "gzip", "mtime": 0})
    pd.DataFrame(e2e).sort_values(["gpu", "workload"]).to_csv(E2E, index=False)
    print(f"{LABELS}: {sum(len(f) for f in frames)} rows; {E2E}: {len(e2e)} workloads")
    for line in neusight.skipped_lines(skipped) + ([f"skipped (not in the mirror, a pointer): {', '.join(pointers)}"]
                                                   if pointers else []):
        print(line)


def fractions(repo: str) -> None:
    """The achievable fractions in gpu_specs.MEASURED_FRACTIONS, from NeuSight's operator microbenchmarks."""
    gemm = pd.read_csv(io.StringIO(_git(repo, "show", "HEAD:scripts/asplos/data/dataset/test/linear.csv")))
    elem = pd.read_csv(io.StringIO(_git(repo, "show", "HEAD:scripts/asplos/data/dataset/test/elem.csv")))
    table = neusight.achieved_fractions(gemm, elem)
    print(table.round(2).to_string())
    if table.attrs["skipped"]:
        print("skipped (GPU not in the spec table): " + ", ".join(table.attrs["skipped"]))


def _load():
    return pd.read_csv(LABELS), pd.read_csv(E2E)


def dev() -> None:
    labels, e2e = _load()
    pairs = neusight.predict_all(labels, e2e, phase="inf")
    print(neusight.interval_factors(pairs).to_string())


def predict() -> None:
    labels, e2e = _load()
    pairs = neusight.predict_all(labels, e2e, phase="train")
    PREDICTIONS.parent.mkdir(parents=True, exist_ok=True)
    kept = pairs[pairs["category"] != "host"][FROZEN]  # host rows keep their time by rule: the e2e rows hold them
    kept.to_csv(PREDICTIONS, index=False, float_format="%.6g", compression={"method": "gzip", "mtime": 0})
    print(f"{PREDICTIONS}: {len(kept)} predictions frozen (measured values left out)")


def _pct(frame: pd.DataFrame) -> pd.DataFrame:
    """Percent columns as 'median / worst' strings, one per predictor."""
    out = frame[["source", "target", "n"]].copy()
    for label in neusight.PREDICTORS.values():
        out[label] = [f"{m:.1f}% / {w:.0f}%"
                      for m, w in zip(frame[f"{label} median %"], frame[f"{label} worst %"], strict=True)]
    return out


def score() -> None:
    """The scored tables, in markdown (median / worst relative error per source -> target pair)."""
    from amp_bench.analysis.predict.model import INTERVALS
    from amp_bench.report.render import markdown_table
    labels, e2e = _load()
    scored = neusight.score(pd.read_csv(PREDICTIONS), labels, e2e)
    print("Per op (forward, backward, accumulation: the ops that move tensors)\n")
    print(markdown_table(_pct(scored["ops"])))
    print("\nEnd to end (one training iteration)\n")
    print(markdown_table(_pct(scored["e2e"])))
    for key in ("worst_ops", "worst_e2e"):
        print(f"\n{key}\n")
        print(markdown_table(scored[key].round(4)))
    whole = scored["rows"][scored["rows"]["phase"] == "e2e"]
    ratio = whole["measured_ms"] / whole["model_ms"]
    low, high = INTERVALS["gpu"]
    inside = ((ratio >= low) & (ratio <= high)).mean()
    print(f"\nmeasured/predicted end to end: p10 {ratio.quantile(0.1):.2f}, median {ratio.median():.2f}, "
          f"p90 {ratio.quantile(0.9):.2f}; inside the 'gpu' interval ({low}-{high}): {inside:.0%} of {len(ratio)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["extract", "fractions", "dev", "predict", "score"])
    parser.add_argument("--repo", help="the NeuSight git directory (extract, fractions)")
    args = parser.parse_args()
    if args.command in ("extract", "fractions"):
        {"extract": extract, "fractions": fractions}[args.command](args.repo)
    else:
        {"dev": dev, "predict": predict, "score": score}[args.command]()


if __name__ == "__main__":
    main()
