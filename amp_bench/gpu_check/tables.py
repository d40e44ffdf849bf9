"""The sections of the GPU check's summary page (amp_bench.gpu_check.summary): suite figures, the published
anchors (docs/sources.md), the plain hand-written loop, fidelity, headroom, failure logs.
Each takes plain frames/dicts and returns markdown lines; torch-free."""
from __future__ import annotations

import contextlib
import math
from pathlib import Path

import numpy as np
import pandas as pd

from amp_bench import identity, modes
from amp_bench.store.flags import text_column

GIB = 2**30
# Published single-GPU ResNet-50 training throughput (images/s): Lambda's deeplearning-benchmark (github.com/lambdal/
# deeplearning-benchmark, pytorch/pytorch-train-throughput-{fp32,fp16}.csv) and NVIDIA DeepLearningExamples
# (PyTorch/Classification/ConvNets/resnet50v1.5/README.md); what their columns mean: docs/sources.md.
# (GPU name contains, source, layout, baseline mode, baseline img/s, AMP img/s). Lambda's baseline
# column is "FP32 or TF32" (cuDNN's TF32 is on by default in PyTorch): our tf32 row is the match.
ANCHORS = [
    ("H200", "Lambda deeplearning-benchmark (H200)", False, "tf32", 2259, 3079),
    ("H100", "Lambda deeplearning-benchmark (H100 SXM)", False, "tf32", 1895, 2790),
    ("A100", "NVIDIA DeepLearningExamples resnet50v1.5 (A100 80GB)", True, "tf32", 938, 2470),
    ("A100", "Lambda deeplearning-benchmark (A100 80GB SXM)", False, "tf32", 1066, 1582),
    ("V100", "NVIDIA DeepLearningExamples resnet50v1.5 (V100 16GB)", True, "fp32", 367, 1200),
    ("4090", "Lambda deeplearning-benchmark (RTX 4090)", False, "tf32", 721, 1301),
]
# bf16 8192^3 matmul measured on the project's H200 (docs/sources.md, "Hardware"): the practical ceiling
MATMUL_MEASURED = {"H200": 790.0}


def fmt(value, digits: int = 3) -> str:
    if hasattr(value, "item"):  # numpy scalars
        value = value.item()
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, (bool,)):
        return "yes" if value else "no"
    if isinstance(value, float):
        if value == 0:
            return "0"
        magnitude = math.floor(math.log10(abs(value)))
        return f"{value:.{max(0, digits - 1 - magnitude)}f}"
    return str(value).replace("|", "/").replace("\n", " ")


def markdown(frame: pd.DataFrame) -> str:
    if frame.empty:
        return "(none)"
    head = "| " + " | ".join(map(str, frame.columns)) + " |"
    rule = "|" + "---|" * len(frame.columns)
    rows = ["| " + " | ".join(fmt(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([head, rule, *rows])


def _flag(value) -> str:
    """yes / no for a yes/no cell (typed on read: a bool, or NA when unknown); '' when unknown."""
    return fmt(value) if isinstance(value, (bool, np.bool_)) else ""


def environment(env: dict) -> list[str]:
    if not env:
        return ["## Environment", "", "(not recorded: the env stage did not finish)", ""]
    device, versions, gpu = env.get("device") or {}, env.get("versions") or {}, env.get("gpu") or {}
    host, software = env.get("host") or {}, env.get("software") or {}
    facts = {"device": device.get("name"), "memory GiB": (device.get("total_memory_bytes") or 0) / GIB or None,
             "driver": gpu.get("driver_version"), "persistence mode": gpu.get("persistence_mode"),
             "power limit W": gpu.get("power_limit_w"), "MIG": gpu.get("mig_mode"), "NVML": gpu.get("nvml") or None,
             "torch": versions.get("torch_version"), "CUDA": versions.get("torch_cuda_version"),
             "cuDNN": versions.get("cudnn_version"), "transformers": versions.get("transformers_version"),
             "git": software.get("git_commit"),
             "environment": " ".join(f"{k}={v}" for k, v in (host.get("env") or {}).items()) or None}
    return ["## Environment", "", *(f"- {k}: {fmt(v)}" for k, v in facts.items() if v not in (None, "")), ""]


def _layout(row) -> str:
    if str(row.get("model", "")).startswith("transformers") or pd.isna(row.get("image_size")):
        return "-"
    return "channels_last" if _flag(row.get("channels_last")) == "yes" else "NCHW"


def suite_table(suite: pd.DataFrame) -> pd.DataFrame:
    """One row per case: speed against fp32 and tf32 of the same group, memory, telemetry, the
    GradScaler host sync and the FP32 math flags as they resolved."""
    keys = identity.keyed(suite)[identity.group_keys()].assign(_order=suite["precision"].map(modes.order_key))
    suite = suite.assign(_group=list(keys[identity.group_keys()].itertuples(index=False, name=None)))  # one group
    ms = suite.set_index(["_group", "precision"])["step_time_ms_median"].to_dict()
    return pd.DataFrame([_suite_row(r, ms) for _, r in
                         suite.loc[keys.sort_values([*identity.group_keys(), "_order"]).index].iterrows()])


def _suite_row(r: pd.Series, ms: dict) -> dict:
    """One case of suite_table; `ms`: (group, precision) -> median step ms, for its speed against the others."""
    own = r.get("step_time_ms_median")
    ok = r["status"] == "ok"

    def vs(base):
        b = ms.get((r["_group"], base))
        return b / own if ok and b and own and not (math.isnan(b) or math.isnan(own)) else None

    def gib(column):
        value = r.get(column)
        return value / GIB if ok and isinstance(value, (int, float)) and not math.isnan(value) else None
    return {
        "model": r["model_label"], "layout": _layout(r), "bs": r["batch_size"], "precision": r["precision"],
        "compile": r.get("compile_mode") if isinstance(r.get("compile_mode"), str) else identity.EAGER,
        "status": r["status"], "ms/step": own if ok else None,
        "cv %": r.get("step_time_cv") * 100 if ok and pd.notna(r.get("step_time_cv")) else None,
        "samples/s": r.get("throughput") if ok else None, "x fp32": vs("fp32"), "x tf32": vs("tf32"),
        "x bf16": vs("amp_bf16") if r["precision"] != "amp_bf16" else None,
        "fp8 layers": (f"{r['fp8_layers_converted']:.0f}/{r['fp8_layers_converted'] + r['fp8_layers_skipped']:.0f}"
                       if ok and pd.notna(r.get("fp8_layers_converted")) else ""),
        "alloc GiB": gib("peak_mem_allocated_bytes"), "reserved GiB": gib("peak_mem_reserved_bytes"),
        "NVML delta GiB": gib("nvml_mem_used_delta_bytes"),
        "TFLOP/s": r.get("achieved_tflops") if ok else None, "MFU": r.get("mfu") if ok else None,
        "MFU bf16 basis": r.get("mfu_bf16_basis") if ok else None,
        "scaler host sync": _flag(r.get("scaler_host_sync")),
        "skips": r.get("scaler_skipped_steps") if pd.notna(r.get("scaler_skipped_steps")) else None,
        "clock events": r.get("clock_event_reasons") if isinstance(r.get("clock_event_reasons"), str) else "",
        "TF32 mm/cudnn": f"{_flag(r.get('tf32_matmul'))}/{_flag(r.get('tf32_cudnn'))}" if ok else "",
    }


def suite_section(suite: pd.DataFrame) -> list[str]:
    lines = ["## Suite", ""]
    if suite.empty:
        return lines + ["(no results: the suite stage did not run or finished no case)", ""]
    lines += [markdown(suite_table(suite)), "",
              "x fp32 / x tf32 / x bf16: median step time of that baseline over this one (same model, layout, "
              "batch, compile mode). fp8 layers: linear layers trained in float8 / all linear layers. "
              "MFU: against the mode's own dense peak (fp8: the fp8 peak, though lm_head and attention stay "
              "bf16); MFU bf16 basis: against the bf16 dense peak, comparable across modes. "
              "NVML delta: device memory used in the window above the idle process (context, libraries, "
              "NCCL). scaler host sync: GradScaler reads found_inf with .item() every fp16 step "
              "(a non-fused optimizer); fused optimizers avoid it.", ""]
    bad = suite[suite["status"] != "ok"]
    if not bad.empty:
        lines += ["Not measured:", ""] + [f"- {r['case_id']}: {r['status']}: {fmt(r.get('reason'))}"
                                          for _, r in bad.iterrows()] + [""]
    warned = suite[text_column(suite, "warnings") != ""]  # "" where the column is absent
    if not warned.empty:
        lines += ["Warnings:", ""] + [f"- {r['case_id']}: {fmt(r['warnings'])[:400]}" for _, r in warned.iterrows()]
        lines.append("")
    return lines


def _case(suite: pd.DataFrame, model: str, precision: str, channels_last: bool | None = None):
    if suite.empty:
        return None
    rows = suite[(suite["model_label"] == model) & (suite["precision"] == precision) & (suite["status"] == "ok")]
    if channels_last is not None and "channels_last" in rows:
        rows = rows[rows["channels_last"].map(_flag) == ("yes" if channels_last else "no")]
    return rows.iloc[0] if not rows.empty else None


def anchors_section(suite: pd.DataFrame, matmul: dict, device_name: str) -> list[str]:
    from amp_bench.platform.peaks import peak_tflops
    lines = ["## Beside the published figures (docs/sources.md)", ""]
    rows = []
    measured = next((v for k, v in MATMUL_MEASURED.items() if k in device_name), None)
    peak = peak_tflops(device_name, "amp_bf16")[0] if device_name else None
    if matmul.get("tflops") or measured or peak:
        rows.append({"figure": "bf16 8192^3 matmul, TFLOP/s", "ours": matmul.get("tflops"), "published": measured,
                     "ours / published": matmul["tflops"] / measured if matmul.get("tflops") and measured else None,
                     "source": "measured on this kind of machine" + (f"; dense peak {peak:g}" if peak else "")})
    for key, source, channels_last, base, base_ips, amp_ips in ANCHORS:
        if key not in device_name:
            continue
        layout = "channels_last" if channels_last else "NCHW"
        ours_base, ours_amp = _case(suite, "resnet50", base, channels_last), _case(suite, "resnet50", "amp_fp16",
                                                                                   channels_last)
        if ours_base is None and ours_amp is None:  # the check runs one layout: ours beside theirs, said
            other = "NCHW" if channels_last else "channels_last"
            ours_base, ours_amp = (_case(suite, "resnet50", base, not channels_last),
                                   _case(suite, "resnet50", "amp_fp16", not channels_last))
            layout = f"{layout} (ours: {other})"
        b = ours_base["throughput"] if ours_base is not None else None
        a = ours_amp["throughput"] if ours_amp is not None else None
        for figure, ours, published in ((f"ResNet-50 {layout} {base}, img/s", b, base_ips),
                                        (f"ResNet-50 {layout} AMP (amp_fp16), img/s", a, amp_ips),
                                        (f"ResNet-50 {layout} AMP speedup over {base}", a / b if a and b else None,
                                         amp_ips / base_ips)):
            rows.append({"figure": figure, "ours": ours, "published": published,
                         "ours / published": ours / published if ours else None, "source": source})
    bf16 = _case(suite, "resnet50", "amp_bf16", True)
    if bf16 is not None and pd.notna(bf16.get("achieved_tflops")) and (matmul.get("tflops") or measured):
        ceiling = matmul.get("tflops") or measured
        rows.append({"figure": "ResNet-50 channels_last amp_bf16, counted TFLOP/s", "ours": bf16["achieved_tflops"],
                     "published": ceiling, "ours / published": bf16["achieved_tflops"] / ceiling,
                     "source": "share of the bf16 matmul ceiling (convolutions reach less)"})
    gpt2 = _case(suite, "gpt2-small", "amp_bf16")
    if gpt2 is not None and pd.notna(gpt2.get("flops_per_step")) and pd.notna(gpt2.get("model_parameters")):
        rule = 6 * gpt2["model_parameters"] * gpt2["batch_size"] * gpt2["seq_len"]
        rows.append({"figure": "GPT-2 small counted FLOPs per step / 6*N*tokens", "ours": gpt2["flops_per_step"] / rule,
                     "published": 1.0, "ours / published": None,
                     "source": "the 6N rule (embeddings are no matmul; attention adds a few % at 128-256 "
                               "tokens): expect about 1.0-1.1"})
    if not rows:
        return lines + [f"No published figure for {device_name or 'this device'} among the check's anchors.", ""]
    return lines + [markdown(pd.DataFrame(rows)), "",
                    "Published runs use their own batch sizes and input pipelines: within 0.6-1.4x of them is "
                    "plausible; far outside, look for a throttled or shared GPU or a measurement fault.", ""]


def plain_loop_section(overhead: pd.DataFrame, suite: pd.DataFrame) -> list[str]:
    lines = ["## Beside a plain hand-written AMP loop (benchmarks/overhead.py, same call)", ""]
    if overhead.empty:
        return lines + ["(not run)", ""]
    first = overhead.iloc[0]
    channels_last = _flag(first["channels_last"]) == "yes"
    case = {"model_label": first["model"], "batch_size": first["batch"], "image_size": first["image_size"],
            "channels_last": channels_last}
    label = (f"{identity.case_label(case)}{'' if channels_last else ' NCHW'} {first['precision']} "
             f"{first['optimizer']} ({first['impl']})")
    rows = [{"measured by": "amp_bench worker (overhead rounds)", "samples/s": overhead["harness_throughput"].median(),
             "median ms/step": overhead["harness_ms"].median()},
            {"measured by": "plain hand-written loop", "samples/s": overhead["plain_throughput"].median(),
             "median ms/step": overhead["plain_ms"].median()}]
    case = _case(suite, str(first["model"]), str(first["precision"]), channels_last)
    if case is not None and case["batch_size"] == first["batch"]:
        rows.insert(0, {"measured by": f"the suite's case {case['case_id']}", "samples/s": case["throughput"],
                        "median ms/step": case["step_time_ms_median"]})
    paired = overhead["ratio"].median()
    verdict = "within" if paired <= first["target"] else "ABOVE"
    return lines + [f"{label}, {len(overhead)} round(s) x {first['steps']} steps on {first['device_name']}:", "",
                    markdown(pd.DataFrame(rows)), "",
                    f"Plain loop over harness, wall-clock window throughput (median of paired rounds): {paired:.3f}, "
                    f"{verdict} the target {first['target']:g}. Throughput is samples over the synchronised window, "
                    "where the harness's host-side cost would show; median step times (CUDA events) are beside it.",
                    ""]


def fidelity_section(fidelity: pd.DataFrame) -> list[str]:
    lines = ["## Fidelity (suites/gpu_check_fidelity.yaml)", ""]
    if fidelity.empty:
        return lines + ["(not run)", ""]
    from amp_bench.analysis.fidelity import load_fidelity
    verdicts = load_fidelity([Path(d) for d in fidelity["run_dir"].unique()])["verdicts"]
    return lines + [markdown(verdicts.reindex(columns=["precision", "seeds", "status", "test_accuracy",
                                                        "accuracy_diff_pp", "tolerance_pp", "verdict"])), ""]


def headroom_section(headroom: pd.DataFrame) -> list[str]:
    lines = ["## Headroom (suites/gpu_check_headroom.yaml)", ""]
    if headroom.empty:
        return lines + ["(not run)", ""]
    return lines + [markdown(headroom.reindex(columns=["model_label", "precision", "status", "max_batch_size",
                                                       "first_oom_batch_size", "batch_ratio_vs_fp32", "probes",
                                                       "reason"])), ""]


def failure_logs(suite: pd.DataFrame, cases: int = 6, tail: int = 12) -> list[str]:
    """The last lines of each failed case's worker log: the raw run directories stay on the machine."""
    if suite.empty or "log_file" not in suite:
        return []
    bad = suite[~suite["status"].isin(["ok", "unsupported"]) & suite["log_file"].notna()]
    lines = []
    for _, r in bad.head(cases).iterrows():
        path = Path(r["run_dir"]) / str(r["log_file"])
        with contextlib.suppress(OSError):  # a log gone: the case's row still says how it ended
            text = path.read_text(encoding="utf-8", errors="replace").splitlines()[-tail:]
            lines += [f"### {r['case_id']} ({r['status']}): last lines of its log", "", "```", *text, "```", ""]
    return (["## Logs of failed cases", ""] + lines) if lines else []


# --------------------------------------------------------------------------- explain on the GPU

EXPLAIN_COLUMNS = {"explain_status": "status", "explain_busy_ms": "busy ms", "explain_host_ms": "host ms",
                   "explain_gemm_ms": "GEMM ms", "explain_attention_ms": "attention ms",
                   "explain_elementwise_ms": "elementwise ms", "explain_norm_ms": "norm ms",
                   "explain_cast_ms": "cast ms", "explain_other_share": "other share"}


def explain_section(suite: pd.DataFrame, top: int = 20) -> list[str]:
    """The explain case's breakdown and its `top` longest GPU kernels by name, with the category the
    classifier gave each: what to read against a real trace when the classifier is in doubt."""
    rows = suite[suite["explain_status"].notna()] if "explain_status" in suite else suite.iloc[:0]  # an empty cell: NA
    if rows.empty:
        return []
    shown = rows[["case_id", *[c for c in EXPLAIN_COLUMNS if c in rows]]].rename(columns=EXPLAIN_COLUMNS)
    lines = ["## Explain on this device", "", markdown(shown), ""]
    for _, row in rows.iterrows():
        kernels = longest_kernels(row, top)
        if kernels is not None:
            lines += [f"The {top} longest kernels of {row['case_id']}'s profiled steps:", "", markdown(kernels), ""]
    return lines


def longest_kernels(row: pd.Series, top: int = 20) -> pd.DataFrame | None:
    """The trace's GPU kernels, memcpys and memsets by total time (None without a readable trace)."""
    from amp_bench.analysis.explain.categories import classify_kernel
    from amp_bench.analysis.explain.events import GPU_CATS, load_trace
    trace = row.get("explain_trace")
    if not isinstance(trace, str) or not trace or "run_dir" not in row or not isinstance(row["run_dir"], str):
        return None
    try:
        events = load_trace(Path(row["run_dir"]) / trace).get("traceEvents", [])
    except (OSError, ValueError):
        return None
    kernels = pd.DataFrame([{"kernel": e.get("name", ""), "us": float(e.get("dur", 0))} for e in events
                            if isinstance(e, dict) and e.get("cat") in GPU_CATS and e.get("ph") == "X"])
    if kernels.empty:
        return None
    table = kernels.groupby("kernel")["us"].agg(["count", "sum"]).sort_values("sum", ascending=False).head(top)
    return pd.DataFrame({"kernel": [k[:120] for k in table.index],
                         "category": [classify_kernel(k) for k in table.index],
                         "calls": table["count"].to_numpy(), "total ms": table["sum"].to_numpy() / 1e3})


def workers_lines(manifests: dict) -> list[str]:
    """How each run's workers started, one line a run: fork, or spawn and why (the run manifest's `workers`)."""
    lines = []
    for name, manifest in manifests.items():
        workers = manifest.get("workers") or {}
        if workers.get("mode") == "fork":
            took = workers.get("server_import_s")
            lines.append(f"- {name}: workers forked from the run's fork server"
                         + (f" (its imports took {took:.1f} s)" if isinstance(took, (int, float)) else ""))
        elif workers:
            lines.append(f"- {name}: workers spawned, each paying its own imports: {workers.get('why', '?')}")
    return ["## Workers", "", *lines, ""] if lines else []


def _seconds(rows: pd.DataFrame, *phases: str) -> float:
    """These phases' seconds over the rows together (a phase without its column: none)."""
    from amp_bench.stats import phase_column
    return float(sum(rows[c].fillna(0.0).sum() for c in map(phase_column, phases) if c in rows))


def time_table(suite: pd.DataFrame) -> pd.DataFrame:
    """One row per worker: where its wall time went (its rows' phases together, repeats that shared it
    included), and what was left beyond the first step (cuDNN's autotuning, a compile) and the windows."""
    from amp_bench.stats import PROBE_PHASES
    if suite.empty or "worker_wall_s" not in suite or suite["worker_wall_s"].isna().all():
        return pd.DataFrame()
    rows = []
    for _, worker in suite[suite["worker_wall_s"].notna()].groupby("log_file", sort=False):
        first = worker.iloc[0]
        wall = float(worker["worker_wall_s"].sum())
        first_step, windows = _seconds(worker, "first_step"), _seconds(worker, "window")
        rows.append({"case": first["case_id"], "repeats": len(worker), "start": first.get("worker_start"),
                     "wall s": wall, "start+imports s": _seconds(worker, "start", "imports"),
                     "setup s": _seconds(worker, "setup", "idle_baseline"), "build s": _seconds(worker, "build"),
                     "first step s": first_step, "warmup+settle s": _seconds(worker, "warmup", "settle"),
                     "windows s": windows, "probes s": _seconds(worker, *PROBE_PHASES),
                     "exit s": _seconds(worker, "exit"), "beyond first step + windows s": wall - first_step - windows})
    return pd.DataFrame(rows)


def time_section(suite: pd.DataFrame) -> list[str]:
    table = time_table(suite)
    if table.empty:
        return []
    return ["## Where each worker's time went", "", markdown(table), "",
            "Seconds from each worker's launch to its reap (rows' phase columns together; repeats that shared "
            "a worker in one line). first step: cuDNN's autotuning or a compile; probes: FLOPs, per-phase memory "
            "and explain's profile. The main job's target: at most 3 s beyond the first step and the windows.", ""]


def main_job_section(suite: pd.DataFrame, stage: dict | None) -> list[str]:
    """Part 1: the main job against its targets: done within 5 minutes, every speedup's 95% interval within
    +-2%, at most 3 s per worker beyond the first step and its windows."""
    from amp_bench.analysis.speedups import paired_speedups
    if suite.empty or "resnet50" not in set(suite["model_label"]):
        return []
    took = (stage or {}).get("seconds")
    lines = ["## The main job against its targets", "",
             f"- wall time: {fmt(took)} s (target: at most 300 s)" if took not in (None, "") else "- wall time: "
             "not recorded"]
    ok = suite[(suite["status"] == "ok") & suite["repeat"].notna()] if "repeat" in suite else suite.iloc[:0]
    found = paired_speedups(ok, "fp32").reset_index() if not ok.empty else pd.DataFrame()
    for _, row in found[found["precision"] != "fp32"].iterrows() if not found.empty else []:
        low, high, point = row["speedup_vs_fp32_ci_low"], row["speedup_vs_fp32_ci_high"], row["speedup_vs_fp32"]
        half = max(point / low - 1, high / point - 1) if low and high and point else float("nan")
        lines.append(f"- {row['precision']} over fp32: {point:.3f}x (95% CI {low:.3f}-{high:.3f}x, +-{half:.1%}; "
                     f"target +-2%: {'met' if half <= 0.02 else 'missed'}; {row['speedup_vs_fp32_method']})")
    table = time_table(suite)
    if not table.empty:
        over = table[table["beyond first step + windows s"] > 3.0]
        lines.append("- beyond the first step and the windows: " + (
            "at most 3 s in every worker (met)" if over.empty else "missed in " + ", ".join(
                f"{r['case']} ({r['beyond first step + windows s']:.1f} s)" for _, r in over.iterrows())))
    return lines + [""]


def fp8_line(suite: pd.DataFrame) -> list[str]:
    """Part 2: fp8's speedup over compiled amp_bf16 on GPT-2 small, from the same run."""
    bf16, fp8 = _case(suite, "gpt2-small", "amp_bf16"), _case(suite, "gpt2-small", "fp8")
    if bf16 is None or fp8 is None:
        return []
    ratio = bf16["step_time_ms_median"] / fp8["step_time_ms_median"]
    return ["## fp8 against compiled bf16", "",
            f"{identity.case_label(fp8, without=('compile_mode',))}, both compiled: fp8 "
            f"{fmt(fp8['step_time_ms_median'])} ms/step against amp_bf16 {fmt(bf16['step_time_ms_median'])}: "
            f"{ratio:.3f}x.", ""]
