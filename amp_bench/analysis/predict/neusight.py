"""NeuSight's public per-op labels as scaling.Work pieces, and the cross-GPU scoring of the rules on
them; torch-free (pandas).

NeuSight (ASPLOS'25, github.com/sitar-lab/NeuSight, MIT) measured, per GPU, every node of one traced
transformer layer (plus the embeddings before it and the head after it) in FP32 with TF32 off: forward,
backward and weight-gradient accumulation times in ms, with input and output shapes; and the whole
model's measured end-to-end time. Its aggregator replicates the layer's rows num_layer times; the
layer spans below (first and last node names) are the facts of that data's layout.

FLOPs and bytes per row are first-order (FP32, 4 bytes an element): GEMMs from their shapes; memory-
bound rows read their inputs and write their output (backward: 1.5x the forward's bytes, an
approximation that cancels in the efficiency-keeping rule and matters only to the roofline baseline);
rows that move no tensor (size, view, getitem on scalars) are host time, never scaled.
"""
from __future__ import annotations

import ast
import re
from math import prod

import numpy as np
import pandas as pd

from amp_bench.analysis.predict.scaling import HOST, Work, scale
from amp_bench.platform.gpu_specs import GpuSpec, by_key

GPUS = {"Tesla_V100-PCIE-32GB": "v100-pcie", "Tesla_T4": "t4", "NVIDIA_A100-PCIE-40GB": "a100-pcie-40gb",
        "NVIDIA_A100_80GB_PCIe": "a100-pcie-80gb", "NVIDIA_L4": "l4", "NVIDIA_H100_80GB_HBM3": "h100-sxm"}
LAYER_SPANS = {"bert": ("bert_encoder_layer_0_attention_self_query", "bert_encoder_layer_0_output_layer_norm"),
               "gpt": ("transformer_h_0_ln_1", "add_15"),
               "opt": ("model_decoder_layers_0_self_attn_layer_norm", "view_11")}
VIEWS = {"size", "view", "permute", "transpose", "dim", "unsqueeze", "expand", "split", "to", "type_as", "float",
         "bool", "long", "type", "reshape", "getitem", "getattr", "finfo", "contiguous_noop"}
PHASES = ("fw", "bw", "acc")
IEEE = (False, False)  # NeuSight ran FP32 with TF32 off


def model_family(workload: str) -> str | None:
    return next((f for f in LAYER_SPANS if workload.startswith(f)), None)


def select_labels(paths: list[str]) -> tuple[list[tuple[str, str, str]], dict[str, dict[str, int]]]:
    """NeuSight's label files (scripts/asplos/label/<GPU>/<workload>.csv) -> ((path, GPU, workload) of those
    used, {why skipped: {GPU or workload: files}}): a GPU outside GPUS (no spec-table entry) or a model
    without a known layer span is named, never dropped without a word."""
    kept, skipped = [], {"GPU not in the spec table": {}, "model without a known layer span": {}}
    for path in paths:
        gpu, file = path.split("/")[-2:]
        if not file.endswith(".csv"):
            continue
        stem = file[:-4]
        why, what = ("GPU not in the spec table", gpu) if gpu not in GPUS else \
            ("model without a known layer span", stem) if model_family(stem) is None else (None, None)
        if why:
            skipped[why][what] = skipped[why].get(what, 0) + 1
        else:
            kept.append((path, gpu, stem))
    return kept, {why: names for why, names in skipped.items() if names}


def skipped_lines(skipped: dict[str, dict[str, int]]) -> list[str]:
    """One line per reason: 'skipped (GPU not in the spec table): P100 (12 files), ...'."""
    return [f"skipped ({why}): " + ", ".join(f"{name} ({n} file{'s' if n > 1 else ''})"
                                               for name, n in sorted(names.items()))
            for why, names in skipped.items()]


def _target(text) -> str:
    text = re.sub(r" at 0x\w+", "", str(text))
    match = re.search(r"(?:function|method) (\w+)", text)
    return match.group(1) if match else text


def trim(labels: pd.DataFrame, gpu: str, workload: str) -> pd.DataFrame:
    """The columns used here, with each row's replication count (num_layer inside the layer span)."""
    module = labels["meta"].astype(str).map(lambda m: (re.findall(r"<class '([^']+)'>", m) or [""])[-1].split(".")[-1])
    out = pd.DataFrame({"gpu": gpu, "workload": workload, "idx": range(len(labels)), "op": labels["op"],
                        "fn": labels["target"].map(_target), "module": module, "name": labels["Name"],
                        "input_shapes": labels["input_shapes"], "output_shape": labels["output_shape"],
                        "fw_ms": labels["fw_latency"].round(6), "bw_ms": labels["bw_latency"].round(6),
                        "acc_ms": labels["acc_latency"].round(6)})
    return out[out["op"].isin(["call_module", "call_function", "call_method"])]


def _shapes(text) -> list[list[int]]:
    try:
        value = ast.literal_eval(str(text))
    except (ValueError, SyntaxError):
        return []
    if isinstance(value, tuple):
        return [list(value)]
    return [list(v) for v in value if isinstance(v, (list, tuple))] if isinstance(value, list) else []


def _gemm_dims(row) -> tuple[int, int, int, int] | None:
    """(batch, M, K, N) of a Linear, addmm, matmul or bmm row."""
    ins, out = _shapes(row["input_shapes"]), _shapes(row["output_shape"])
    if row["module"] == "Linear" and ins and out:
        return 1, prod(ins[0][:-1]), ins[0][-1], out[0][-1]
    if row["fn"] == "addmm" and len(ins) == 3:
        return 1, ins[1][0], ins[1][1], ins[2][1]
    if row["fn"] in ("matmul", "bmm") and len(ins) == 2 and len(ins[0]) >= 2:
        return prod(ins[0][:-2]) if len(ins[0]) > 2 else 1, ins[0][-2], ins[0][-1], ins[1][-1]
    return None


def _gemm_cost(dims, phase: str) -> tuple[float, float]:
    b, m, k, n = dims
    moved = 4.0 * b * (m * k + k * n + m * n)
    return {"fw": (2.0 * b * m * k * n, moved), "bw": (4.0 * b * m * k * n, 2 * moved),
            "acc": (0.0, 12.0 * (k * n + n))}[phase]


def _memory_cost(row, phase: str, vocab: int) -> float:
    ins, out = _shapes(row["input_shapes"]), _shapes(row["output_shape"])
    n_out = prod(out[0]) if out else 0
    if row["module"] == "Embedding":
        rows = vocab if re.search(r"word|wte|embed_tokens", str(row["name"])) else max(prod(ins[0]) if ins else 1, 2)
        weight = rows * (out[0][-1] if out else 1)
        return {"fw": 8.0 * n_out, "bw": 8.0 * n_out + 4.0 * weight, "acc": 12.0 * weight}[phase]
    fw = 4.0 * (sum(prod(s) for s in ins) + n_out)
    if phase == "acc":  # LayerNorm weight and bias
        return 24.0 * (out[0][-1] if out else 0)
    return fw if phase == "fw" else 1.5 * fw


def _is_host(row) -> bool:
    shapes = _shapes(row["input_shapes"]) + _shapes(row["output_shape"])
    biggest = max((prod(s) for s in shapes), default=0)
    return row["fn"] in VIEWS or biggest <= 4096


def works(rows: pd.DataFrame) -> list[tuple[dict, Work]]:
    """(row keys, Work) for every row and phase with a measured time."""
    vocab = _vocab(rows)
    out = []
    for _, row in rows.iterrows():
        for phase in PHASES:
            ms = float(row[f"{phase}_ms"])
            if ms <= 0:
                continue
            keys = {"idx": int(row["idx"]), "name": row["name"], "phase": phase}
            dims = _gemm_dims(row)
            if dims is not None:
                flops, moved = _gemm_cost(dims, phase)  # acc: the weight gradient's accumulation, bytes only
                out.append((keys, Work(row["name"], "gemm" if flops else "optimizer", ms, flops, moved,
                                       "fp32" if flops else None)))
            elif _is_host(row):
                out.append((keys, Work(row["name"], HOST, ms)))
            else:
                out.append((keys, Work(row["name"], "elementwise", ms, 0.0, _memory_cost(row, phase, vocab))))
    return out


def _vocab(rows: pd.DataFrame) -> int:
    """The vocabulary: the widest output of a GEMM row (the LM head)."""
    return max((_shapes(s)[0][-1] for s in rows["output_shape"] if _shapes(s)), default=1)


def repeats(rows: pd.DataFrame, num_layer: int) -> pd.Series:
    """How many times each row counts end to end: num_layer inside the layer span, once outside."""
    first, last = LAYER_SPANS[model_family(str(rows["workload"].iloc[0]))]
    names = list(rows["name"])
    if first not in names or last not in names:
        return pd.Series(1, index=rows.index)
    inside = (rows["idx"] >= rows.loc[rows["name"] == first, "idx"].iloc[0]) & \
             (rows["idx"] <= rows.loc[rows["name"] == last, "idx"].iloc[0])
    return inside.map({True: num_layer, False: 1})


def predict_pair(rows: pd.DataFrame, source: GpuSpec, target: GpuSpec) -> pd.DataFrame:
    """Per row and phase of the source's labels: the model's, the spec-sheet roofline's, the op
    inventory's (no source time) and the 'same time' prediction on the target, with the rule used."""
    out = []
    for keys, work in works(rows):
        scaled = scale(work, source, target, IEEE, IEEE)
        inventory = scale(Work(work.label, work.category, None, work.flops, work.bytes, work.math), target, target,
                          IEEE, IEEE) if work.category != HOST else None
        out.append({**keys, "category": work.category, "source_ms": work.source_ms, "model_ms": scaled.ms,
                    "rule": scaled.rule, "roofline_ms": spec_roofline_ms(work, target), "inventory_ms":
                    inventory.ms if inventory else work.source_ms, "same_ms": work.source_ms})
    return pd.DataFrame(out)


def spec_roofline_ms(work: Work, spec: GpuSpec) -> float:
    """The plain spec-sheet roofline (datasheet FP32 peak and bandwidth, no derating), the baseline
    the issue names; host rows keep their time (no roofline prices Python)."""
    if work.category == HOST:
        return work.source_ms or 0.0
    return max(work.flops / (spec.peak("fp32") * 1e12), work.bytes / (spec.bandwidth_gbs * 1e9)) * 1e3


def predict_all(labels: pd.DataFrame, e2e: pd.DataFrame, phase: str) -> pd.DataFrame:
    """Every ordered pair of GPUs that measured the same workload ('train' or 'inf' labels): per-op rows
    and one end-to-end row ('op' = '<e2e>') per pair, with the target's measured time."""
    specs = by_key()
    labels = labels[labels["workload"].str.contains(f"-{phase}-")]
    frames = []
    for workload, rows in labels.groupby("workload", sort=True):
        gpus = sorted(rows["gpu"].unique())
        for src in gpus:
            src_rows = rows[rows["gpu"] == src]
            layers = int(e2e.loc[(e2e["gpu"] == src) & (e2e["workload"] == workload), "num_layer"].iloc[0])
            weight = repeats(src_rows, layers)
            for dst in (g for g in gpus if g != src):
                ops = predict_pair(src_rows, specs[GPUS[src]], specs[GPUS[dst]])
                ops["repeat"] = ops["idx"].map(dict(zip(src_rows["idx"], weight, strict=True)))
                frames.append(_with_e2e(ops, workload, src, dst, rows, e2e))
    return pd.concat(frames, ignore_index=True)


def _with_e2e(ops: pd.DataFrame, workload: str, src: str, dst: str, rows: pd.DataFrame, e2e: pd.DataFrame):
    measured = rows[rows["gpu"] == dst].set_index("idx")
    ops["measured_ms"] = [float(measured.loc[i, f"{p}_ms"]) if i in measured.index else np.nan
                          for i, p in zip(ops["idx"], ops["phase"], strict=True)]
    e2e_src = float(e2e.loc[(e2e["gpu"] == src) & (e2e["workload"] == workload), "e2e_ms"].iloc[0])
    e2e_dst = float(e2e.loc[(e2e["gpu"] == dst) & (e2e["workload"] == workload), "e2e_ms"].iloc[0])
    total = lambda col: float((ops[col].fillna(0) * ops["repeat"]).sum())
    whole = {"idx": -1, "name": "<e2e>", "phase": "e2e", "category": "step", "source_ms": e2e_src,
             "model_ms": e2e_src * total("model_ms") / total("source_ms"), "rule": "sum of the ops' ratios",
             "roofline_ms": total("roofline_ms"), "inventory_ms": total("inventory_ms"), "same_ms": e2e_src,
             "repeat": 1, "measured_ms": e2e_dst}
    ops = pd.concat([ops, pd.DataFrame([whole])], ignore_index=True)
    return ops.assign(workload=workload, source=GPUS[src], target=GPUS[dst])


def interval_factors(pairs: pd.DataFrame) -> pd.DataFrame:
    """10th/50th/90th percentiles of measured/predicted end to end, for the model (a GPU source) and
    the op inventory (a CPU source): the factors model.INTERVALS takes."""
    whole = pairs[pairs["phase"] == "e2e"]
    rows = []
    for column in ("model_ms", "inventory_ms"):
        ratio = whole["measured_ms"] / whole[column]
        rows.append({"predictor": column, "p10": ratio.quantile(0.1), "p50": ratio.median(),
                     "p90": ratio.quantile(0.9), "pairs": len(ratio)})
    return pd.DataFrame(rows)


def achieved_fractions(gemm: pd.DataFrame, elem: pd.DataFrame) -> pd.DataFrame:
    """Per GPU of NeuSight's operator dataset: the 90th percentile of achieved FP32 GEMM TFLOP/s (linear
    layers, 2BMNK FLOPs, latency in ms) and of elementwise GB/s (binary ops move 3 tensors, unary 2), over
    the datasheet figures."""
    specs = {spec.device_name: spec for spec in by_key().values()}
    tflops = 2.0 * gemm["B"] * gemm["M"] * gemm["N"] * gemm["K"] / (gemm["Latency"] * 1e-3) / 1e12
    moved = np.where(elem["OPName"].isin(["add", "mul", "div", "pow"]), 3, 2) * 4.0 * elem["B"] * elem["H"]
    gbs = pd.Series(moved / (elem["Latency"] * 1e-3) / 1e9, index=elem.index)
    rows = []
    unknown = sorted((set(gemm["Device"]) | set(elem["Device"])) - set(specs))
    for device, spec in specs.items():
        row = {"gpu": spec.key}
        if (gemm["Device"] == device).any():
            row["fp32"] = tflops[gemm["Device"] == device].quantile(0.9) / spec.peak("fp32")
        if (elem["Device"] == device).any():
            row["bandwidth"] = gbs[elem["Device"] == device].quantile(0.9) / spec.bandwidth_gbs
        if len(row) > 1:
            rows.append(row)
    out = pd.DataFrame(rows)
    out.attrs["skipped"] = unknown  # devices of the dataset the spec table does not hold
    return out


PREDICTORS = {"model_ms": "amp_bench", "roofline_ms": "roofline (spec sheet)", "same_ms": "same time as the source"}


def _errors(frame: pd.DataFrame) -> pd.DataFrame:
    errors = {column.replace("_ms", "_error"): (frame[column] - frame["measured_ms"]).abs() / frame["measured_ms"]
              for column in PREDICTORS}
    return frame.assign(**errors)


def score(frozen: pd.DataFrame, labels: pd.DataFrame, e2e: pd.DataFrame,
          phase: str = "train") -> dict[str, pd.DataFrame]:
    """The frozen predictions against the measured labels: per source -> target pair, the median and worst
    relative error of each predictor, per op (the ops that move tensors; host rows left out) and end to end;
    and per pair the op and the workload the model missed most."""
    measured = predict_all(labels, e2e, phase)[["workload", "source", "target", "idx", "phase", "measured_ms"]]
    table = _errors(frozen.merge(measured, on=["workload", "source", "target", "idx", "phase"], how="left"))
    table = table[table["measured_ms"] > 0]
    ops = table[(table["phase"] != "e2e") & (table["category"] != HOST)]
    whole = table[table["phase"] == "e2e"]
    return {"ops": _per_pair(ops), "e2e": _per_pair(whole), "worst_ops": _worst(ops), "worst_e2e": _worst(whole),
            "rows": table}


def _per_pair(frame: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for (source, target), group in list(frame.groupby(["source", "target"])) + [(("all", "all"), frame)]:
        row = {"source": source, "target": target, "n": len(group)}
        for column, label in PREDICTORS.items():
            errors = group[column.replace("_ms", "_error")]
            row[f"{label} median %"] = 100 * errors.median()
            row[f"{label} worst %"] = 100 * errors.max()
        rows.append(row)
    return pd.DataFrame(rows)


def _worst(frame: pd.DataFrame) -> pd.DataFrame:
    """Per pair, the row the model missed most: which op (or workload), its phase and the rule used."""
    picked = frame.loc[frame.groupby(["source", "target"])["model_error"].idxmax()]
    return picked[["source", "target", "workload", "name", "phase", "category", "rule", "source_ms", "measured_ms",
                   "model_ms", "model_error"]].reset_index(drop=True)
