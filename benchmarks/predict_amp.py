"""The public AMP pairs and their steps on fake tensors, for fitting and scoring predict's pricing
(benchmarks/predict_fit.py fits, cross-validates and scores).

    python benchmarks/predict_amp.py extract --dle DLE.git --lambda LAMBDA.git  # tests/data/predict/amp_pairs.csv
    python benchmarks/predict_amp.py inventories     # fake-tensor step traces at every published batch (torch)

Sources: NVIDIA DeepLearningExamples at 729963dd (PyTorch ResNet-50 v1.5 README and configs.yml; BERT
README), Lambda's deeplearning-benchmark at aa5addb6 (pytorch/pytorch-train-throughput-{fp32,fp16}.csv,
pytorch-train-bs-{fp32,fp16}.csv: the one-GPU rows). Each pair keeps its batch per arm, layout per arm and
baseline (FP32 or TF32). These are the only published AMP tables the project fits on (benchmarks/
predict_fit.py); every other one is kept for scoring outside it.
"""
from __future__ import annotations

import argparse
import io
import subprocess
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PAIRS = ROOT / "tests" / "data" / "predict" / "amp_pairs.csv"
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["extract", "inventories"])
    parser.add_argument("--dle", help="DeepLearningExamples git directory (extract)")
    parser.add_argument("--lambda", dest="lam", help="deeplearning-benchmark git directory (extract)")
    args = parser.parse_args()
    if args.command == "extract":
        extract(args.dle, args.lam)
    else:
        sys.path.insert(0, str(Path(__file__).parent))
        inventories()


if __name__ == "__main__":
    main()
