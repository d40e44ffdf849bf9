"""`predict SUITE|RUN_DIR --target h100-sxm,a100-80gb,l4,v100-sxm2`: what each case and mode would give on
GPUs you do not have: step time, throughput, speedup over the target's fp32 and peak memory, each with an
interval, or 'unsupported' and why. A GPU run is scaled from its profiled kernels (analysis/predict/); a suite,
or a run from a machine without a GPU, from its GPU cases recorded on fake tensors (studies/gpu_predictions.py).
This module prints."""
from __future__ import annotations

from pathlib import Path

from rich.markup import escape
from rich.table import Table

FP32_AS = ("mode", "pytorch-default")


def add_parsers(sub) -> None:
    from amp_bench.analysis.predict.settings import DEFAULT_TARGETS
    predict = sub.add_parser("predict", help="predict each case's step time, throughput, AMP speedup and peak memory "
                                             "on GPUs you do not have, from a suite or a run, with no GPU")
    predict.add_argument("run_dir", type=Path, nargs="?", metavar="suite_or_run_dir",
                         help="a suite file (its GPU cases, recorded on fake tensors) or a run directory (a GPU "
                              "run's profiled steps; a CPU run's suite)")
    predict.add_argument("--target", help="comma-separated GPUs (default: the suite's predict.targets, else "
                                          f"{','.join(DEFAULT_TARGETS)}); --list-targets names them")
    predict.add_argument("--list-targets", action="store_true", help="print the spec table and exit")
    predict.add_argument("--fp32-as", choices=FP32_AS, help="what the FP32 of the fp32 and AMP modes means on a "
                         "target: 'mode' (default: amp_bench's strict IEEE) or 'pytorch-default' (cuDNN TF32 on "
                         "from Ampere, matmul TF32 off: a plain PyTorch script)")
    predict.add_argument("--source-gpu", help="the spec-table key of the run's GPU when its name is not in the table")
    predict.add_argument("--breakdown", action="store_true", help="also print each prediction per category")
    predict.add_argument("--csv", type=Path, help="write the predictions (and PATH.breakdown.csv) there")
    predict.set_defaults(func=cmd_predict)


def spec_table() -> Table:
    """The GPUs `--target` takes, their dense peaks and bandwidth, and where each figure comes from."""
    from amp_bench.analysis.predict.settings import fraction_label
    from amp_bench.platform.gpu_specs import SPECS
    table = Table(title="GPUs predict knows (dense datasheet peaks, TFLOP/s; bandwidth GB/s)")
    for column in ("key", "GPU", "cc", "FP32", "TF32", "FP16", "BF16", "FP8", "GB/s", "achievable fraction", "sources"):
        table.add_column(column)
    for spec in SPECS:
        peaks, source = spec.peaks()
        table.add_row(spec.key, spec.label, f"{spec.capability[0]}.{spec.capability[1]}",
                      *[f"{peaks[u]:g}" if u in peaks else "-" for u in ("fp32", "tf32", "fp16", "bf16", "fp8")],
                      f"{spec.bandwidth_gbs:g}", fraction_label(spec), escape(f"{source}; {spec.source}"))
    return table


def _interval(value, low, high, digits: int = 1, suffix: str = "") -> str:
    if value != value or value is None:
        return "-"
    return f"{value:.{digits}f}{suffix} ({low:.{digits}f}-{high:.{digits}f})"


def case_table(case_label: str, rows, source: str) -> Table:
    """One case: a row per target and mode, with its interval or why there is none."""
    table = Table(title=f"{case_label}: predicted from {source}", title_justify="left")
    memory = rows["peak_memory_bytes"].notna().any()
    for column, justify in (("GPU", "left"), ("mode", "left"), ("step ms", "right"), ("samples/s", "right"),
                            ("speedup vs fp32", "right"), *((("peak memory", "right"), ("saved", "right"))
                                                             if memory else ()), ("", "left")):
        table.add_column(column, justify=justify)
    for _, row in rows.iterrows():
        if row["status"] != "ok":
            table.add_row(row["target_label"], row["precision"], "-", "-", "-", *(("-", "-") if memory else ()),
                          f"[yellow]{row['status']}[/]: {escape(str(row['reason']))}")
            continue
        table.add_row(row["target_label"], row["precision"],
                      _interval(row["step_ms"], row["step_ms_low"], row["step_ms_high"]),
                      _interval(row["throughput"], row["throughput_low"], row["throughput_high"], 0),
                      _interval(row["speedup"], row["speedup_low"], row["speedup_high"], 2, "x"),
                      *((gib(row["peak_memory_bytes"]), percent(row["memory_saving"])) if memory else ()), "")
    return table


def gib(value) -> str:
    return "-" if value != value or value is None else f"{value / 2**30:.1f} GiB"


def percent(value) -> str:
    return "-" if value != value or value is None else f"{value:.0%}"


def _targets(args) -> tuple[list[str], str | None]:
    """The targets and fp32 meaning: the options, else the suite's `predict:` block, else defaults."""
    from amp_bench.analysis.predict.settings import chosen
    return chosen(args.run_dir, args.target, args.fp32_as)


def _unused(args, result) -> list[str]:
    """One line for each option this run has no use for."""
    if args.source_gpu and not any(case.is_gpu for case in result.cases):
        what = "a suite has" if Path(args.run_dir).is_file() else "this is a CPU run: it has"
        return [f"--source-gpu {args.source_gpu}: not used: {what} no GPU profile to scale (its GPU cases are "
                "recorded on fake tensors)"]
    return []


def cmd_predict(args, console) -> int:
    """One table per case, the notes, and the CSVs when asked; bad input is one line (UserError)."""
    from amp_bench.analysis.predict.settings import notes
    from amp_bench.errors import UserError
    from amp_bench.studies.gpu_predictions import predict_source
    if args.list_targets:
        console.print(spec_table())
        if args.run_dir is not None:
            console.print(f"[yellow]note[/]: {escape(str(args.run_dir))}: not read with --list-targets",
                          highlight=False)
        return 0
    if args.run_dir is None:
        raise UserError("predict: give a SUITE file or a RUN_DIR (a run directory), or --list-targets")
    targets, fp32_as = _targets(args)
    result = predict_source(args.run_dir, targets, fp32_as, args.source_gpu)
    for line in _unused(args, result):
        console.print(f"[yellow]note[/]: {escape(line)}", highlight=False, soft_wrap=True)
    for case in result.cases:
        rows = result.table[result.table["case"] == case.label]
        console.print(case_table(case.label, rows, rows["source"].iloc[0] if len(rows) else "?"))
        if args.breakdown:
            console.print(breakdown_table(result.breakdown[result.breakdown["case"] == case.label]))
    for line in notes(result, targets, fp32_as):
        console.print(f"- {escape(line)}", highlight=False, soft_wrap=True)
    if args.csv:
        args.csv.parent.mkdir(parents=True, exist_ok=True)
        result.table.to_csv(args.csv, index=False)
        result.breakdown.to_csv(args.csv.with_suffix(".breakdown.csv"), index=False)
        console.print(f"wrote {args.csv} and {args.csv.with_suffix('.breakdown.csv')}")
    return 0


def breakdown_table(parts) -> Table:
    """ms per category on the source and on each target, per mode: where the prediction comes from."""
    table = Table(title="per category: source ms -> target ms", title_justify="left")
    for column in ("mode", "GPU", "category", "source ms", "target ms"):
        table.add_column(column)
    for _, row in parts.iterrows():
        table.add_row(row["precision"], row["target"], row["category"],
                      f"{row['source_ms']:.2f}" if row["source_ms"] else "-", f"{row['target_ms']:.2f}")
    return table


def predicted_gpus_table(result, source, console) -> None:
    """A run's end on a machine without a GPU: each AMP mode's predicted speedup over fp32 and memory saving
    on each target, the cross-validated error in one line, and the command for more."""
    from amp_bench.analysis.predict.settings import recorded_line
    table = Table(title="On GPUs (predicted, nothing measured here)", title_justify="left")
    for column, justify in (("case", "left"), ("GPU", "left"), ("mode", "left"), ("speedup vs fp32", "right"),
                            ("samples/s", "right"), ("peak memory", "right"), ("saved", "right"), ("", "left")):
        table.add_column(column, justify=justify)
    rows = result.table[result.table["precision"] != result.table["baseline"].dropna().iloc[0]] \
        if result.table["baseline"].notna().any() else result.table
    for _, row in rows.iterrows():
        cells = (_interval(row["speedup"], row["speedup_low"], row["speedup_high"], 2, "x"),
                 _interval(row["throughput"], row["throughput_low"], row["throughput_high"], 0),
                 gib(row["peak_memory_bytes"]), percent(row["memory_saving"]))
        why = "" if row["status"] == "ok" else f"{row['status']}: {row['reason']}"
        table.add_row(row["case"], row["target_label"], row["precision"],
                      *(cells if row["status"] == "ok" else ("-",) * 4), escape(why))
    console.print(table)
    console.print(escape(recorded_line()), highlight=False, soft_wrap=True)
    console.print(f"more GPUs: python -m amp_bench predict {source} --target KEY,... (--list-targets names them)",
                  highlight=False, soft_wrap=True)
