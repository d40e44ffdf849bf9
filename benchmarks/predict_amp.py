"""AMP speedups predicted from op inventories (no GPU profile exists here), scored against the public tables.

    python benchmarks/predict_amp.py extract --dle DLE.git --lambda LAMBDA.git  # tests/data/predict/amp_pairs.csv
    python benchmarks/predict_amp.py inventories     # fake-tensor step traces at every published batch (torch)
    python benchmarks/predict_amp.py predict         # freezes docs/predict/amp_predictions.csv
    python benchmarks/predict_amp.py score           # the scored tables (markdown) for docs/predict.md

Sources: NVIDIA DeepLearningExamples at 729963dd (PyTorch ResNet-50 v1.5 README and configs.yml; BERT
README), Lambda's deeplearning-benchmark at aa5addb6 (pytorch/pytorch-train-throughput-{fp32,fp16}.csv,
pytorch-train-bs-{fp32,fp16}.csv: the one-GPU rows). Each pair keeps its batch per arm, layout per arm and
baseline (FP32 or TF32). Protocol: predictions are written and committed before any scoring; nothing in
amp_bench was tuned on these tables.
"""
from __future__ import annotations

import argparse
import io
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PAIRS = ROOT / "tests" / "data" / "predict" / "amp_pairs.csv"
PREDICTIONS = ROOT / "docs" / "predict" / "amp_predictions.csv"
INVENTORIES = ROOT / "results" / "predict_inventories"
BUILT = ("resnet50", "bert_base_squad", "bert_large_squad", "bert_large_pretrain_128", "bert_large_pretrain_512")

_RN50 = "PyTorch/Classification/ConvNets/resnet50v1.5/README.md, Training performance (1 GPU row); batch and layout: " \
        "PyTorch/Classification/ConvNets/configs.yml (resnet50: TF32/FP32 NCHW, AMP nhwc)"
_BERT = "PyTorch/LanguageModeling/BERT/README.md, Training performance results (1 GPU row)"
_HF = "HF BertFor* (eager attention) stands in for NVIDIA's BERT (fused bias-GELU, LayerNorm kernels)"
# (row label as published, gpu key, model, baseline, batch base, batch amp, layout base, layout amp,
#  throughput base, throughput amp, published speedup, source, note)
DLE_ROWS = [
    ("DGX A100 (1x A100 80GB)", "a100-80gb", "resnet50", "tf32", 256, 256, "nchw", "nhwc", 938, 2470, 2.63, _RN50, ""),
    ("DGX-1 16GB (1x V100 16GB)", "v100-sxm2", "resnet50", "fp32", 112, 256, "nchw", "nhwc", 367, 1200, 3.26, _RN50,
     ""),
    ("DGX-1 32GB (1x V100 32GB)", "v100-sxm2", "resnet50", "fp32", 112, 256, "nchw", "nhwc", 356, 1156, 3.24, _RN50,
     ""),
    ("DGX A100 (1x A100 80GB), SQuAD", "a100-80gb", "bert_large_squad", "tf32", 32, 32, "", "", 61.5, 110.5, 1.79,
     _BERT, _HF + "; sequence length 384 (the README's SQuAD default)"),
    ("DGX-1 32G (1x V100 32GB), SQuAD", "v100-sxm2", "bert_large_squad", "fp32", 8, 16, "", "", 12, 52, 4.33, _BERT,
     _HF + "; sequence length 384"),
    ("DGX A100 (1x A100 80GB), pretraining seq 128", "a100-80gb", "bert_large_pretrain_128", "tf32", 128, 256, "", "",
     317, 580, 1.83, _BERT, _HF + "; LAMB with gradient accumulation there, AdamW per micro-batch here"),
    ("DGX A100 (1x A100 80GB), pretraining seq 512", "a100-80gb", "bert_large_pretrain_512", "tf32", 16, 32, "", "",
     110, 210, 1.90, _BERT, _HF + "; LAMB with gradient accumulation there, AdamW per micro-batch here"),
    ("DGX-1 32G (1x V100 32GB), pretraining seq 128", "v100-sxm2", "bert_large_pretrain_128", "fp32", 32, 64, "", "",
     50, 224, 4.48, _BERT, _HF + "; micro-batch = 4096 / accumulation steps (128 and 64)"),
    ("DGX-1 32G (1x V100 32GB), pretraining seq 512", "v100-sxm2", "bert_large_pretrain_512", "fp32", 4, 8, "", "",
     19, 75, 3.94, _BERT, _HF + "; micro-batch = 2048 / accumulation steps (512 and 256)"),
]
LAMBDA_GPUS = {"LambdaCloud V100 16GB": "v100-sxm2", "LambdaCloud A10": "a10",
               "LambdaCloud A100 40GB PCIe": "a100-pcie-40gb",
               "A100 80GB PCIe": "a100-pcie-80gb", "A100 80GB SXM4": "a100-80gb", "RTX 4090": "rtx-4090",
               "H100 80GB PCIe Gen5": "h100-pcie", "LambdaCloud H100 80GB PCIe Gen5": "h100-pcie",
               "H100 80GB SXM5": "h100-sxm", "Dell H100 80GB SXM5": "h100-sxm", "DellTexas H100 80GB SXM5": "h100-sxm",
               "SMC H100 80GB SXM5": "h100-sxm", "1CC H100 80GB SXM5": "h100-sxm", "RAIDZ1 H100 80GB SXM5": "h100-sxm"}
LAMBDA_MODELS = ("resnet50", "bert_base_squad", "bert_large_squad")


def _dle_pairs() -> list[dict]:
    names = ["row", "target", "model", "baseline", "baseline_batch", "amp_batch", "baseline_layout", "amp_layout",
             "baseline_throughput", "amp_throughput", "published_speedup", "source", "note"]
    rows = [dict(zip(names, r, strict=True)) for r in DLE_ROWS]
    for row in rows:
        row.update(table="NVIDIA DLE", gpu=row["row"].split("(1x ")[1].split(")")[0], unit="samples/s")
    return rows


def _lambda_csv(repo: str, name: str) -> pd.DataFrame:
    text = subprocess.run(["git", "--git-dir", repo, "show", f"HEAD:pytorch/{name}.csv"], capture_output=True,
                          text=True, check=True).stdout
    return pd.read_csv(io.StringIO(text)).set_index("name_gpu")


def _lambda_pairs(repo: str) -> list[dict]:
    base, amp = _lambda_csv(repo, "pytorch-train-throughput-fp32"), _lambda_csv(repo, "pytorch-train-throughput-fp16")
    bs32, bs16 = _lambda_csv(repo, "pytorch-train-bs-fp32"), _lambda_csv(repo, "pytorch-train-bs-fp16")
    rows = []
    for name in base.index[base["num_gpu"] == 1]:
        target = LAMBDA_GPUS.get(name, "")
        for model in LAMBDA_MODELS:
            if not (base.loc[name, model] > 0 and amp.loc[name, model] > 0):
                continue
            rows.append({"table": "Lambda v1", "row": name, "gpu": name, "target": target, "model": model,
                         "baseline": "tf32" if target and not target.startswith(("v100", "t4")) else "fp32",
                         "baseline_batch": int(bs32.loc[name, model]), "amp_batch": int(bs16.loc[name, model]),
                         "baseline_layout": "nchw" if model == "resnet50" else "", "amp_layout": "nchw" if model ==
                         "resnet50" else "", "baseline_throughput": float(base.loc[name, model]),
                         "amp_throughput": float(amp.loc[name, model]), "published_speedup": None, "unit": "samples/s",
                         "source": "pytorch/pytorch-train-throughput-{fp32,fp16}.csv, pytorch-train-bs-{fp32,fp16}.csv",
                         "note": _lambda_note(name, target, model)})
    return rows


def _lambda_note(name: str, target: str, model: str) -> str:
    notes = []
    if not target:
        notes.append("no spec-table entry for this GPU: not predicted")
    elif not target.startswith("v100"):
        notes.append("'fp32' column read as TF32 (NGC container default on Ampere+; docs/sources.md)")
    if name == "LambdaCloud V100 16GB":
        notes.append("form factor not stated: SXM2 assumed")
    if model != "resnet50":
        notes.append(_HF + "; sequence length 384")
    return "; ".join(notes)


def extract(dle: str, lam: str) -> None:
    """tests/data/predict/amp_pairs.csv: the DLE rows (cited literals) and Lambda's one-GPU rows."""
    del dle  # the DLE figures are the literal rows above, each cited: its READMEs are prose tables
    rows = _dle_pairs() + _lambda_pairs(lam)
    pairs = pd.DataFrame(rows)
    pairs.insert(0, "pair", range(1, len(pairs) + 1))
    first = ~pairs.duplicated(["table", "model", "target"]) | (pairs["target"] == "")
    pairs["scored"] = (pairs["target"] != "") & pairs["model"].isin(BUILT) & first
    pairs.loc[(pairs["target"] != "") & ~first, "note"] = pairs["note"] + "; a repeat machine of a GPU already scored"
    PAIRS.parent.mkdir(parents=True, exist_ok=True)
    pairs.to_csv(PAIRS, index=False)
    print(f"{PAIRS}: {len(pairs)} pairs, {int(pairs['scored'].sum())} to score")


def _inventory_path(model: str, batch: int, precision: str, layout: str) -> Path:
    return INVENTORIES / f"{model}-bs{batch}-{precision}{'-cl' if layout == 'nhwc' else ''}.json.gz"


def _arms(pairs: pd.DataFrame):
    for _, p in pairs[pairs["scored"]].iterrows():
        yield p, (p["model"], int(p["baseline_batch"]), "fp32", p["baseline_layout"]), \
            (p["model"], int(p["amp_batch"]), "amp_fp16", p["amp_layout"])


def inventories() -> None:
    """One fake-tensor step trace per arm of every scored pair, cached under results/ (git-ignored)."""
    import gzip
    import json

    from predict_inventory import capture
    INVENTORIES.mkdir(parents=True, exist_ok=True)
    wanted = {arm for _, base, amp in _arms(pd.read_csv(PAIRS)) for arm in (base, amp)}
    for model, batch, precision, layout in sorted(wanted):
        path = _inventory_path(model, batch, precision, layout)
        if not path.is_file():
            with gzip.open(path, "wt", encoding="utf-8") as fh:
                json.dump(capture(model, batch, precision, layout == "nhwc"), fh)
        print(path.name)


def predict() -> None:
    """Every scored pair's predicted speedup from its two inventories, written to docs/predict/ (frozen)."""
    from amp_bench.analysis.predict.inventory import inventory
    from amp_bench.analysis.predict.model import INTERVALS, price_inventory
    from amp_bench.platform.gpu_specs import by_key
    specs, rows = by_key(), []
    for pair, base, amp in _arms(pd.read_csv(PAIRS)):
        target, tf32 = specs[pair["target"]], (True, True) if pair["baseline"] == "tf32" else (False, False)
        base_step = price_inventory(inventory(_inventory_path(*base)), target, tf32, base[1])
        amp_step = price_inventory(inventory(_inventory_path(*amp)), target, (False, False), amp[1])
        speedup = base_step.step_ms * amp[1] / (amp_step.step_ms * base[1])  # throughput ratio, batches differ
        lo, hi = INTERVALS["cpu"]
        rows.append({"pair": pair["pair"], "predicted_baseline_ms": base_step.step_ms,
                     "predicted_amp_ms": amp_step.step_ms,
                     "predicted_speedup": speedup, "predicted_speedup_low": speedup * lo,
                     "predicted_speedup_high": speedup * hi})
    PREDICTIONS.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(PREDICTIONS, index=False, float_format="%.6g")
    print(f"{PREDICTIONS}: {len(rows)} predictions frozen")


def _why_not(row) -> str:
    if row["scored"]:
        return ""
    if pd.isna(row["target"]):
        return "no spec entry"
    return "repeat machine" if "repeat machine" in str(row["note"]) else "no inventory"


def _compact(scored: pd.DataFrame) -> pd.DataFrame:
    """Every pair, scored or not, as docs/predict.md lists them."""
    def arm(row):
        layouts = f" {row['baseline_layout']}->{row['amp_layout']}" if isinstance(row["baseline_layout"], str) else ""
        return f"{row['baseline']} bs {row['baseline_batch']} -> fp16 bs {row['amp_batch']}{layouts}"
    out = pd.DataFrame({"pair": scored["pair"], "table": scored["table"], "GPU": scored["gpu"],
                        "model": scored["model"],
                        "arms": scored.apply(arm, axis=1), "measured speedup": scored["measured_speedup"]})
    out["amp_bench speedup (interval)"] = [f"{p:.2f}x ({lo:.2f}-{hi:.2f})" if p == p else "-" for p, lo, hi in zip(
        scored["predicted_speedup"], scored["predicted_speedup_low"], scored["predicted_speedup_high"], strict=True)]
    out["peak ratio"] = scored["peak_ratio"]
    out["amp_bench error x"] = (scored["model_log_error"]).map(lambda e: f"{np.exp(e):.2f}" if e == e else "-")
    out["source-GPU guess, median error x"] = scored["source_gpu_median_log_error"].map(
        lambda e: f"{np.exp(e):.2f}" if e == e else "-")
    out["not scored"] = scored.apply(_why_not, axis=1)
    return out


def score() -> None:
    """The scored tables, in markdown: the summary (all, and per table), GPU rankings, every pair."""
    from amp_bench.analysis.predict.amp_tables import kendall, summary
    from amp_bench.analysis.predict.amp_tables import score as score_pairs
    from amp_bench.report.render import markdown_table
    scored = score_pairs(pd.read_csv(PAIRS), pd.read_csv(PREDICTIONS))
    print(markdown_table(summary(scored)))
    for table, group in scored[scored["scored"]].groupby("table"):
        print(f"\n{table}\n\n" + markdown_table(summary(group)))
    ranks = [{"table": t, "model": m, "GPUs": len(g), "amp_bench tau": kendall(g, "predicted_speedup"),
              "peak ratio tau": kendall(g, "peak_ratio")}
             for (t, m), g in scored[scored["scored"]].groupby(["table", "model"])]
    print("\n" + markdown_table(pd.DataFrame(ranks)))
    inside = scored.loc[scored["scored"], "inside_interval"]
    print(f"\nmeasured speedup inside the predicted interval: {inside.mean():.0%} of {len(inside)}\n")
    print(markdown_table(_compact(scored)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["extract", "inventories", "predict", "score"])
    parser.add_argument("--dle", help="DeepLearningExamples git directory (extract)")
    parser.add_argument("--lambda", dest="lam", help="deeplearning-benchmark git directory (extract)")
    args = parser.parse_args()
    if args.command == "extract":
        extract(args.dle, args.lam)
    else:
        sys.path.insert(0, str(Path(__file__).parent))
        {"inventories": inventories, "predict": predict, "score": score}[args.command]()


if __name__ == "__main__":
    main()
