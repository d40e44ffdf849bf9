"""`predict RUN_DIR --target h100-sxm,a100-80gb,l4,v100-sxm2`: what each case and mode of a run would give
on GPUs you do not have: step time, throughput and speedup over the target's fp32, each with an
interval, or 'unsupported' and why. The work is analysis/predict/ (torch-free); this module prints."""
from __future__ import annotations

from pathlib import Path

from rich.markup import escape
from rich.table import Table

DEFAULT_TARGETS = ("h100-sxm", "a100-80gb", "l4", "v100-sxm2")
FP32_AS = ("mode", "pytorch-default")


def add_parsers(sub) -> None:
    predict = sub.add_parser("predict", help="predict each case's step time, throughput and AMP speedup on other "
                                             "GPUs from a run's profiled steps (run with explain on)")
    predict.add_argument("run_dir", type=Path, nargs="?", help="a run directory (results.csv and traces/)")
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
    for column, justify in (("GPU", "left"), ("mode", "left"), ("step ms", "right"), ("samples/s", "right"),
                            ("speedup vs fp32", "right"), ("", "left")):
        table.add_column(column, justify=justify)
    for _, row in rows.iterrows():
        if row["status"] != "ok":
            table.add_row(row["target_label"], row["precision"], "-", "-", "-",
                          f"[yellow]{row['status']}[/]: {escape(str(row['reason']))}")
            continue
        table.add_row(row["target_label"], row["precision"],
                      _interval(row["step_ms"], row["step_ms_low"], row["step_ms_high"]),
                      _interval(row["throughput"], row["throughput_low"], row["throughput_high"], 0),
                      _interval(row["speedup"], row["speedup_low"], row["speedup_high"], 2, "x"), "")
    return table


def _targets(args) -> tuple[list[str], str | None]:
    """The targets and fp32 meaning: the options, else the run's suite's `predict:` block, else defaults."""
    from amp_bench.analysis.predict.settings import suite_settings
    settings = suite_settings(args.run_dir)
    targets = list(args.target or settings.get("targets") or DEFAULT_TARGETS)
    fp32_as = args.fp32_as or settings.get("fp32_as")
    return targets, (None if fp32_as in (None, "mode") else fp32_as)


def _unused(args, result) -> list[str]:
    """One line for each option this run has no use for."""
    if args.source_gpu and not any(case.is_gpu for case in result.cases):
        return [f"--source-gpu {args.source_gpu}: not used: this is a CPU run, priced from its op inventory "
                "(no GPU profile to scale)"]
    return []


def cmd_predict(args, console) -> int:
    """One table per case, the notes, and the CSVs when asked; bad input is one line (UserError)."""
    from amp_bench.analysis.predict.model import predict_run
    from amp_bench.analysis.predict.settings import notes
    from amp_bench.errors import UserError
    if args.list_targets:
        console.print(spec_table())
        if args.run_dir is not None:
            console.print(f"[yellow]note[/]: {escape(str(args.run_dir))}: not read with --list-targets",
                          highlight=False)
        return 0
    if args.run_dir is None:
        raise UserError("predict: give a RUN_DIR (a run directory with results.csv and traces/), or --list-targets")
    targets, fp32_as = _targets(args)
    result = predict_run(args.run_dir, targets, fp32_as, args.source_gpu)
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
