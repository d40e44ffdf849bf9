"""Fit predict's pricing parameters (amp_bench/analysis/predict/pricing.py) on the data this project holds,
cross-validate them, freeze the predictions, then score them beside the naive guesses.

    python benchmarks/predict_fit.py capture   # the H200 reading's cases on fake tensors (torch, ~1 min)
    python benchmarks/predict_fit.py fit       # writes amp_bench/analysis/predict/fitted.py and freezes
                                               # docs/predict/amp_crossval.csv (a few minutes)
    python benchmarks/predict_fit.py fit --reuse-crossval   # fitted.py again, from the frozen predictions
    python benchmarks/predict_fit.py score     # the tables docs/predict.md shows, from the frozen file

Data (nothing else is fitted on; every other published AMP table is kept for scoring outside the project):
- the 32 scored DLE and Lambda pairs of tests/data/predict/amp_pairs.csv, each arm's step recorded on fake
  tensors at its published batch and layout (benchmarks/predict_amp.py inventories); priced as a fusing
  stack (NVIDIA's NGC containers, whose "FP32" is TF32 from Ampere on, both arms);
- this project's H200 reading (docs/gpu-validation/2026-12-04-h200-5436a8a): ResNet-50 bs 256 channels_last
  fp32, tf32 and amp_fp16 (part1_suite.csv) and amp_bf16 (part1_overhead.csv), fused AdamW; GPT-2 (2 layers,
  bs 256, seq 128, sdpa) amp_bf16 per category (part2_suite.csv's explain_step_samples); eager PyTorch.

Cross-validation: leave one GPU out (the pair's spec key: every pair of that GPU, both tables) and leave one
network out (resnet50, bert_base, bert_large: its SQuAD and pretraining pairs together, and with ResNet-50
the H200's ResNet-50 readings too). Each fold refits on the rest; its interval is the 5th-95th percentile
of the fold's own inner cross-validation residuals (nested), so no held-out pair shapes its interval.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from amp_bench.analysis.predict import amp_tables, pricing
from amp_bench.analysis.predict.inventory import priced_inventory
from amp_bench.platform.gpu_specs import GpuSpec, by_key

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))
from predict_amp import PAIRS, _arms, _inventory_path

READING = ROOT / "docs" / "gpu-validation" / "2026-12-04-h200-5436a8a"
INVENTORIES = ROOT / "results" / "predict_inventories"
FITTED = ROOT / "amp_bench" / "analysis" / "predict" / "fitted.py"
CROSSVAL = ROOT / "docs" / "predict" / "amp_crossval.csv"
NETWORKS = {"resnet50": "resnet50", "bert_base_squad": "bert_base", "bert_large_squad": "bert_large",
            "bert_large_pretrain_128": "bert_large", "bert_large_pretrain_512": "bert_large"}
QUANTILES = (0.05, 0.95)
SPEEDUP_WEIGHT, READING_WEIGHT, CATEGORY_WEIGHT, PRIOR_WEIGHT = 4.0, 6.0, 5.0, 0.1
NEUSIGHT_WEIGHT = 2.0
FIXED = {"kernel_us": 4.0}  # not fitted: the 5th percentile of kernel times in HTA's public A100 traces
SCHEMES = ("gpu", "model", "network")  # the intervals pool the first two: a new GPU, a new model
H200_CASES = {  # name: (suite, model label, precision, channels_last, what the reading measured)
    "resnet50-fp32": ("resnet50", "resnet50", "fp32"), "resnet50-tf32": ("resnet50", "resnet50", "tf32"),
    "resnet50-amp_fp16": ("resnet50", "resnet50", "amp_fp16"),
    "resnet50-amp_bf16": ("resnet50", "resnet50", "amp_bf16"),
    "gpt2-amp_bf16": ("gpu_check_part2", "gpt2-explain", "amp_bf16")}
# the GPT-2 reading's categories of 1 ms or more, as observables: a GPU trace files kernels by name and an
# inventory ops by name, and they split elementwise from layout work differently (a fill kernel is layout)
# A public memory figure (the Hugging Face transformers guide "Performance and Scalability: How To Fit a Bigger
# Model and Train It Faster", v4.2x): bert-large-uncased sequence classification, sequence 512, batch 4,
# Trainer (AdamW), nvidia-smi's used memory on its GPU: 14949 MiB in fp32, 13939 MiB with fp16, after 1343 MiB
# of CUDA context and kernels measured before the model was loaded
HF_GUIDE = {"fp32": 14949, "amp_fp16": 13939, "context": 1343}
HF_SUITE = """models:
  - ref: transformers/bert
    task: sequence-classification
    config: {hidden_size: 1024, num_hidden_layers: 24, num_attention_heads: 16, intermediate_size: 4096}
    attn_implementation: eager
seq_len: 512
batch_sizes: [4]
precisions: [fp32, amp_fp16]
optimizer: {name: adamw, impl: for-loop}
"""
CATEGORIES_READ = {"gemm": ("gemm",), "elementwise and layout": ("elementwise", "layout"), "norm": ("norm",),
                   "reduction": ("reduction",), "cast": ("cast",)}


@dataclass
class Arm:
    """One measured step: its inventory, where it ran and how, what was measured, its groups."""
    name: str
    ops: pricing.Ops
    spec: GpuSpec
    tf32: tuple[bool, bool]
    stack: str
    batch: int
    measured_ms: float | None  # the step (None: only categories)
    categories_ms: dict = field(default_factory=dict)  # measured ms per category (the GPT-2 reading)
    gpu: str = ""
    network: str = ""
    model: str = ""  # the tables' model (resnet50, bert_base_squad, ...), or the reading's network
    pair: int | None = None
    side: str = ""  # "baseline" or "amp" for a table arm

    def step_ms(self, params: dict) -> float:
        return float(np.nansum(pricing.op_ms(self.ops, self.spec, self.tf32, params, self.stack)))

    def category_ms(self, params: dict) -> dict:
        times = pricing.op_ms(self.ops, self.spec, self.tf32, params, self.stack)
        return {name: float(times[np.isin(self.ops.category, CATEGORIES_READ[name])].sum())
                for name in self.categories_ms}


def _ops(path: Path) -> pricing.Ops:
    return pricing.Ops.of(priced_inventory(path)[0])


def table_arms() -> list[Arm]:
    """Both arms of every scored pair, priced as the tables' stack: TF32 from Ampere on in both arms."""
    specs, arms = by_key(), []
    for pair, base, amp in _arms(pd.read_csv(PAIRS)):
        tf32 = (True, True) if pair["baseline"] == "tf32" else (False, False)
        for side, key, thr in (("baseline", base, pair["baseline_throughput"]), ("amp", amp, pair["amp_throughput"])):
            layout = key[3] if isinstance(key[3], str) else ""
            arms.append(Arm(f"pair {pair['pair']} {side}", _ops(_inventory_path(key[0], key[1], key[2], layout)),
                            specs[pair["target"]], tf32, "fused", key[1], key[1] * 1e3 / thr, gpu=pair["target"],
                            network=NETWORKS[pair["model"]], model=pair["model"], pair=int(pair["pair"]),
                            side=side))
    return arms


def _reading() -> dict:
    """The H200 reading's figures: step ms per case, and GPT-2's ms per category (medians of its steps)."""
    suite1, overhead = pd.read_csv(READING / "part1_suite.csv"), pd.read_csv(READING / "part1_overhead.csv")
    steps = {f"resnet50-{p}": float(m) for p, m in zip(suite1["precision"], suite1["step_time_ms_median"],
                                                                          strict=True)}
    steps["resnet50-amp_bf16"] = float(overhead.loc[overhead["precision"] == "amp_bf16", "harness_ms"].iloc[0])
    suite2 = pd.read_csv(READING / "part2_suite.csv")
    gpt2 = suite2[suite2["model_label"] == "gpt2-explain"].iloc[0]
    samples = json.loads(gpt2["explain_step_samples"])
    steps["gpt2-amp_bf16"] = float(gpt2["step_time_ms_median"])
    categories = {name: float(sum(np.median(samples[c]) for c in kinds)) for name, kinds in CATEGORIES_READ.items()}
    return {"steps": steps, "gpt2_categories": categories}


def _h200_case(name: str):
    """The reading's case as a suite Case (the main job's ResNet-50 with the fused AdamW it ran then)."""
    import dataclasses

    from amp_bench.suite import load_suite
    suite_name, label, precision = H200_CASES[name]
    cases = load_suite(ROOT / "suites" / f"{suite_name}.yaml").cases("cuda")
    case = next(c for c in cases if c.model.label == label and c.precision == precision)
    if suite_name == "resnet50":  # the reading ran fused AdamW (the suite's SGD came later)
        case = dataclasses.replace(case, optimizer=dataclasses.replace(case.optimizer, name="adamw", impl="fused",
                                                                       lr=1e-4, weight_decay=0.01, momentum=0.0))
    return case


def capture() -> None:
    import gzip
    import tempfile

    from amp_bench.measure.fake_step import record_case
    from amp_bench.suite import load_suite
    INVENTORIES.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "hf.yaml").write_text(HF_SUITE, encoding="utf-8")
        for case in load_suite(Path(folder) / "hf.yaml").cases("cuda"):
            memory = record_case(case)[1]
            (INVENTORIES / f"hf-bert-large-{case.precision}.memory.json").write_text(json.dumps(memory))
    for name in H200_CASES:
        trace, memory, _ = record_case(_h200_case(name))
        with gzip.open(INVENTORIES / f"h200-{name}.json.gz", "wt", encoding="utf-8") as fh:
            json.dump(trace, fh)
        (INVENTORIES / f"h200-{name}.memory.json").write_text(json.dumps(memory), encoding="utf-8")
        print(name, {k: f"{v / 2**30:.2f} GiB" for k, v in memory.items()})


def reading_arms() -> list[Arm]:
    spec, reading, arms = by_key()["h200"], _reading(), []
    for name, (_, _, precision) in H200_CASES.items():
        tf32 = (True, True) if precision == "tf32" else (False, False)
        categories = reading["gpt2_categories"] if name.startswith("gpt2") else {}
        arms.append(Arm(f"H200 {name}", _ops(INVENTORIES / f"h200-{name}.json.gz"), spec, tf32, "eager", 256,
                        reading["steps"][name], categories, gpu="h200", network=name.split("-")[0],
                        model=name.split("-")[0]))
    return arms


@dataclass
class OpTimes:
    """Standalone ops measured one by one on a GPU (NeuSight's labels): the observable is the median log
    error over them, one figure per GPU, so thousands of rows weigh as one reading."""
    name: str
    ops: pricing.Ops
    spec: GpuSpec
    measured_ms: np.ndarray
    gpu: str
    network: str = ""  # BERT-large's rows leave with the tables' BERT-large when that network is held out
    model: str = ""
    pair: None = None

    def log_error(self, params: dict) -> float:
        times = pricing.op_ms(self.ops, self.spec, (False, False), params, "eager")
        return float(np.median(np.log(times / self.measured_ms)))


def neusight_gemms(min_ms: float = 0.05) -> list[OpTimes]:
    """Per GPU, the FP32 (TF32 off) GEMMs of NeuSight's training labels that took at least `min_ms`
    (forward and backward), each its own entry: what gemm_fp32 is on each chip, independent of the tables."""
    from amp_bench.analysis.predict import neusight
    labels, specs, out = pd.read_csv(ROOT / "tests" / "data" / "predict" / "neusight_labels.csv.gz"), by_key(), []
    labels = labels[labels["workload"].str.contains("-train-")]
    labels = labels.assign(network=np.where(labels["workload"].str.startswith("bert_large"), "bert_large", ""))
    for (gpu, network), rows in labels.groupby(["gpu", "network"]):
        gemms = [w for _, w in neusight.works(rows) if w.category == "gemm" and w.flops and w.source_ms >= min_ms]
        ops = pricing.Ops(*(np.array(v, dtype=object if i < 2 else float) for i, v in enumerate(
            ([w.category for w in gemms], ["fp32"] * len(gemms), [w.flops for w in gemms],
             [w.bytes for w in gemms], [1.0] * len(gemms), [0.0] * len(gemms)))),
            np.zeros(len(gemms), bool), np.ones(len(gemms)))
        key = neusight.GPUS[gpu]
        out.append(OpTimes(f"NeuSight {key} {network or 'GPT/OPT'} GEMMs", ops, specs[key],
                           np.array([w.source_ms for w in gemms]), key, network))
    return out


NAMES = list(pricing.PARAMETERS)
FREE = [n for n in NAMES if n not in FIXED]


def _robust(error: float, scale: float = 0.1) -> float:
    """soft-L1 (scipy's) on one error: quadratic within `scale`, linear beyond; for the tables' absolute
    throughputs, where a workload that differs from the published one (DLE's unpadded pretraining) must not
    pull every parameter (speedups and the H200 reading are fitted as plain least squares)."""
    return float(np.sign(error) * scale * np.sqrt(2 * (np.sqrt(1 + (error / scale) ** 2) - 1)))


def residuals(x, arms: list) -> np.ndarray:
    params = {**FIXED, **dict(zip(FREE, np.exp(x), strict=True))}
    out, by_pair = [], {}
    for arm in arms:
        if isinstance(arm, OpTimes):
            out.append(NEUSIGHT_WEIGHT * arm.log_error(params))
            continue
        predicted = arm.step_ms(params)
        error = np.log(predicted / arm.measured_ms)
        out.append(READING_WEIGHT * error if arm.stack == "eager" else _robust(error))
        for category, ms in arm.category_ms(params).items():
            out.append(CATEGORY_WEIGHT * np.log(max(ms, 1e-6) / arm.categories_ms[category]))
        if arm.pair is not None:
            by_pair.setdefault(arm.pair, {})[arm.side] = (predicted, arm.measured_ms)
    for sides in by_pair.values():
        if len(sides) == 2:
            (pb, mb), (pa, ma) = sides["baseline"], sides["amp"]
            out.append(SPEEDUP_WEIGHT * (np.log(pb / pa) - np.log(mb / ma)))
    out += [PRIOR_WEIGHT * (xi - np.log(pricing.PARAMETERS[n][0])) for n, xi in zip(FREE, x, strict=True)]
    return np.array(out)


def fit(arms: list[Arm]) -> dict:
    """The parameters that best explain `arms` (robust least squares on log errors, pulled weakly toward the
    priors so a parameter no arm informs keeps its prior)."""
    x0 = np.log([pricing.PARAMETERS[n][0] for n in FREE])
    lo = np.log([max(pricing.PARAMETERS[n][1][0], 1e-3) for n in FREE])
    hi = np.log([pricing.PARAMETERS[n][1][1] for n in FREE])
    result = least_squares(residuals, np.clip(x0, lo + 1e-9, hi - 1e-9), args=(arms,), bounds=(lo, hi))
    return {**FIXED, **dict(zip(FREE, np.exp(result.x), strict=True))}


def _pair_predictions(params: dict, arms: list[Arm]) -> dict[int, dict]:
    out: dict[int, dict] = {}
    for arm in arms:
        if arm.pair is not None:
            out.setdefault(arm.pair, {})[arm.side] = arm.batch * 1e3 / arm.step_ms(params)
    return out


def _log_errors(params: dict, arms: list[Arm]) -> tuple[list[float], list[float]]:
    """(speedup log errors, throughput log errors) of the table arms' pairs under `params`: log(predicted
    / measured)."""
    predicted = _pair_predictions(params, arms)
    truth: dict[int, dict] = {}
    for arm in arms:
        if arm.pair is not None:
            truth.setdefault(arm.pair, {})[arm.side] = arm.batch * 1e3 / arm.measured_ms
    speedups, throughputs = [], []
    for pair, sides in predicted.items():
        if len(sides) == 2:
            speedups.append(np.log(sides["amp"] / sides["baseline"] * truth[pair]["baseline"] / truth[pair]["amp"]))
            throughputs += [np.log(sides[side] / truth[pair][side]) for side in sides]
    return speedups, throughputs


def _folds(arms: list[Arm], scheme: str) -> dict[str, tuple[list[Arm], list[Arm]]]:
    """{held-out group: (training arms, held-out table arms)} for a scheme: 'gpu', 'model' or 'network'."""
    key = scheme
    groups = sorted({getattr(a, key) for a in arms if a.pair is not None})
    return {g: ([a for a in arms if getattr(a, key) != g],
                [a for a in arms if a.pair is not None and getattr(a, key) == g]) for g in groups}


def _inner_interval(train: list[Arm], scheme: str) -> dict[str, tuple[float, float]]:
    """The 5th-95th percentiles of out-of-fold log errors within `train` (its own folds of `scheme`)."""
    speedups, throughputs = [], []
    for inner_train, held in _folds(train, scheme).values():
        if held and any(a.pair is not None for a in inner_train):
            s, t = _log_errors(fit(inner_train), held)
            speedups += s
            throughputs += t
    # measured = predicted / exp(error): the interval around a prediction is exp(-error)'s percentiles
    return {"speedup": tuple(np.exp(-np.quantile(speedups, QUANTILES[::-1]))),
            "throughput": tuple(np.exp(-np.quantile(throughputs, QUANTILES[::-1])))}


def crossval(arms: list[Arm], scheme: str) -> pd.DataFrame:
    """Every held-out pair's predicted arms and speedup, with the fold's nested interval."""
    rows = []
    for group, (train, held) in _folds(arms, scheme).items():
        params, interval = fit(train), _inner_interval(train, scheme)
        lo, hi = interval["speedup"]
        for pair, sides in _pair_predictions(params, held).items():
            speedup = sides["amp"] / sides["baseline"]
            rows.append({"scheme": scheme, "held_out": group, "pair": pair, "predicted_baseline_throughput":
                         sides["baseline"], "predicted_amp_throughput": sides["amp"], "predicted_speedup": speedup,
                         "predicted_speedup_low": speedup * lo, "predicted_speedup_high": speedup * hi,
                         "throughput_factor_low": interval["throughput"][0],
                         "throughput_factor_high": interval["throughput"][1]})
        print(f"{scheme} {group}: {len(held) // 2} pairs held out", flush=True)
    return pd.DataFrame(rows)


def _write_fitted(params: dict, crossval_rows: pd.DataFrame, pairs: pd.DataFrame) -> None:
    """fitted.py: the parameters of the fit on everything, and the intervals the cross-validated errors give."""
    import datetime
    scored = amp_tables.scored(crossval_rows[crossval_rows["scheme"].isin(SCHEMES[:2])], pairs)
    speedup = np.exp(-np.quantile(scored["speedup_log_error"], QUANTILES[::-1]))
    throughput = np.exp(-np.quantile(np.concatenate([scored["baseline_log_error"], scored["amp_log_error"]]),
                                     QUANTILES[::-1]))
    lines = [f'"""Generated by `python benchmarks/predict_fit.py fit` on {datetime.date.today()}: do not edit, rerun',
             "it. The pricing parameters (analysis/predict/pricing.py's PARAMETERS say what each is) fitted on the DLE",
             "and Lambda AMP pairs (tests/data/predict/amp_pairs.csv), the H200 reading (docs/gpu-validation/) and",
             "NeuSight's FP32 GEMM labels; INTERVALS: measured / predicted at the 5th and 95th percentiles of the",
             "errors of the leave-one-GPU-out and leave-one-model-out predictions (docs/predict/amp_crossval.csv,",
             'docs/predict.md)."""',
             "", "PARAMETERS = {"]
    lines += [f'    "{name}": {value:.4g},' for name, value in params.items()]
    lines += ["}", f"INTERVALS = {{\"speedup\": ({speedup[0]:.3f}, {speedup[1]:.3f}), "
                   f"\"throughput\": ({throughput[0]:.3f}, {throughput[1]:.3f})}}",
              "# median and worst |error| as factors, per cross-validation (what the output quotes)", "SCORES = {"]
    for scheme, group in scored.groupby("scheme", sort=False):
        arms = np.abs(np.concatenate([group["baseline_log_error"], group["amp_log_error"]]))
        speedup = np.abs(group["speedup_log_error"])
        lines.append(f'    "{scheme}": {{"speedup_median": {np.exp(np.median(speedup)):.3f}, "speedup_worst": '
                     f'{np.exp(speedup.max()):.3f}, "throughput_median": {np.exp(np.median(arms)):.3f}, '
                     f'"pairs": {len(group)}}},')
    lines += ["}", ""]
    FITTED.write_text("\n".join(lines), encoding="utf-8")


def fit_all(reuse_crossval: bool = False) -> None:
    """The cross-validated predictions (frozen in CROSSVAL; with `reuse_crossval`, the frozen ones are read
    back instead), then the fit on everything and fitted.py."""
    arms = table_arms() + reading_arms() + neusight_gemms()
    if reuse_crossval:
        rows = pd.read_csv(CROSSVAL)
    else:
        rows = pd.concat([crossval(arms, scheme) for scheme in SCHEMES], ignore_index=True)
        CROSSVAL.parent.mkdir(parents=True, exist_ok=True)
        rows.to_csv(CROSSVAL, index=False, float_format="%.6g")
    params = fit(arms)
    _write_fitted(params, rows, pd.read_csv(PAIRS))
    print(f"{CROSSVAL}: {len(rows)} held-out predictions frozen; {FITTED}: {len(params)} parameters")


def _peak(name: str) -> float:
    return json.loads((INVENTORIES / f"{name}.memory.json").read_text(encoding="utf-8"))["peak"]


def memory_check() -> pd.DataFrame:
    """Predicted peak memory against the H200 reading's max_memory_allocated (tensors) and, with the reading's
    reserved/allocated ratio and the guide's own context, against the HF guide's nvidia-smi figures."""
    suite1 = pd.read_csv(READING / "part1_suite.csv")
    rows, reserve = [], float((suite1["peak_mem_reserved_bytes"] / suite1["peak_mem_allocated_bytes"]).mean())
    for precision, allocated in zip(suite1["precision"], suite1["peak_mem_allocated_bytes"], strict=True):
        peak = _peak(f"h200-resnet50-{precision}")
        rows.append({"case": f"ResNet-50 bs 256 channels_last {precision}, H200 max_memory_allocated",
                     "predicted MiB": peak / 2**20, "measured MiB": allocated / 2**20, "error": peak / allocated - 1})
    for precision in ("fp32", "amp_fp16"):
        predicted = _peak(f"hf-bert-large-{precision}") / 2**20 * reserve + HF_GUIDE["context"]
        rows.append({"case": f"bert-large seq 512 bs 4 {precision}, HF guide's nvidia-smi (x{reserve:.3f} reserved, "
                             f"+{HF_GUIDE['context']} MiB context)", "predicted MiB": predicted,
                     "measured MiB": HF_GUIDE[precision], "error": predicted / HF_GUIDE[precision] - 1})
    return pd.DataFrame(rows)


def parameter_table() -> pd.DataFrame:
    """Each parameter: its fitted value, prior, range and meaning (fitted.py beside pricing.PARAMETERS)."""
    from amp_bench.analysis.predict import fitted
    return pd.DataFrame([{"parameter": name, "fitted": f"{fitted.PARAMETERS[name]:.3g}" + (
                              " (fixed, not fitted)" if name in FIXED else ""), "prior": f"{prior:g}",
                          "range": f"{low:g}-{high:g}", "what it is": what}
                         for name, (prior, (low, high), what) in pricing.PARAMETERS.items()])


def score() -> None:
    from amp_bench.report.render import markdown_table
    print(markdown_table(parameter_table()) + "\n")
    rows, pairs = pd.read_csv(CROSSVAL), pd.read_csv(PAIRS)
    print(markdown_table(amp_tables.summary(rows, pairs)))
    scored = amp_tables.scored(rows, pairs)
    for scheme, group in scored.groupby("scheme", sort=False):
        table = group[["pair", "held_out", "table", "gpu", "model", "measured_speedup", "predicted_speedup",
                       "predicted_speedup_low", "predicted_speedup_high"]].copy()
        table["error x"] = np.exp(group["speedup_log_error"].abs())
        print(f"\n{scheme}\n\n" + markdown_table(table.round(3)))
    print("\n" + markdown_table(memory_check().round(3)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["capture", "fit", "score"])
    parser.add_argument("--reuse-crossval", action="store_true", help="fit: read the frozen cross-validated "
                        "predictions instead of making them again (fitted.py only)")
    args = parser.parse_args()
    if args.command == "fit":
        fit_all(args.reuse_crossval)
    else:
        {"capture": capture, "score": score}[args.command]()


if __name__ == "__main__":
    main()
