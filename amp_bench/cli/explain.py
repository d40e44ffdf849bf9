"""`explain SUITE`: run a suite with `explain: true` (studies/explain.py) and print where each case's step time went, per
category and mode, with one sentence per model and batch. Cases without a breakdown (failed,
unsupported, profile unavailable) get one line each; none at all exits non-zero.
`explain --trace A [--trace B]`: the same reading of any torch.profiler / Kineto trace, and of B against A."""
from __future__ import annotations

from pathlib import Path

from rich.markup import escape
from rich.table import Table

EXIT_NOTHING_EXPLAINED = 3


def add_parsers(sub) -> None:
    explain = sub.add_parser("explain", help="run a suite with one profiled step per case and say where the time "
                                             "goes (GEMM, conv, elementwise, casts, ...) and why the speedup is what it is")
    explain.add_argument("suite", type=Path, nargs="?", help="a suite to run (or --trace to read traces instead)")
    explain.add_argument("--trace", type=Path, action="append", metavar="TRACE.json[.gz]",
                         help="read a torch.profiler / Kineto trace instead of running a suite; twice: the second "
                              "against the first")
    explain.add_argument("--modes", metavar="BASE,MODE", help="with two traces: the precision each ran (e.g. "
                         "fp32,amp_bf16), for the ceiling")
    explain.add_argument("--cpu-isa", default="", help="with two CPU traces: the CPU's flags (e.g. avx512_bf16 or "
                         "amx_bf16), for the ceiling")
    explain.add_argument("--device", help="auto (default: the suite's, else auto), cpu, cuda, cuda:N")
    explain.add_argument("--results-dir", type=Path, default=Path("results"))
    explain.add_argument("--batch-size", type=int, action="append", help="repeatable; replaces batch_sizes")
    explain.add_argument("--precision", action="append", help="repeatable; replaces precisions")
    explain.add_argument("--steps", type=int, help="a fixed number of measured steps per case")
    explain.add_argument("--repeats", type=int)
    explain.add_argument("--budget", type=float, metavar="SECONDS", help="the whole run's budget")
    explain.add_argument("--allow-emulated", action="store_true", default=None)
    explain.add_argument("--no-report", action="store_true", help="don't write reports/<run-id>.html at the end")
    explain.add_argument("--reports-dir", type=Path, default=Path("reports"))
    explain.set_defaults(func=cmd_explain)


def breakdown_table(results) -> Table:
    """ms per step by category (rows) for each case and mode (columns)."""
    from amp_bench.analysis.explain.categories import CATEGORIES, HOST, LABELS
    from amp_bench.analysis.explain.decompose import category_table
    long = category_table(results)
    table = Table(title="Where the profiled step's time went (ms per step; share of the step)")
    table.add_column("category")
    columns = list(dict.fromkeys(zip(long["case"], long["precision"])))
    for case, precision in columns:
        table.add_column(f"{case}\n{precision}", justify="right")
    for category in list(CATEGORIES) + [HOST]:
        cells = []
        for case, precision in columns:
            row = long[(long["case"] == case) & (long["precision"] == precision) & (long["category"] == category)]
            ms, share = (row["ms_per_step"].iloc[0], row["share_of_step"].iloc[0]) if not row.empty else (None, None)
            cells.append("-" if ms is None else f"{ms:.1f} ({share:.0%})" if share is not None else f"{ms:.1f}")
        if any(c not in ("-", "0.0 (0%)") for c in cells):
            table.add_row(LABELS[category], *cells)
    return table


def _ceiling_inputs(args, explanation_profiles) -> tuple[tuple[str, str] | None, float | None, str]:
    """(modes, GEMM/conv peak ratio, its source) for two traces: the GPU's dense peaks
    (platform/peaks.py) or the CPU's ISA; (None, None, why) when not known."""
    from amp_bench import modes as registry
    from amp_bench.analysis.explain.ceiling import cpu_unit
    from amp_bench.errors import UserError
    from amp_bench.platform.peaks import peak_tflops
    if not args.modes:
        return None, None, ""
    pair = tuple(m.strip() for m in args.modes.split(","))
    if len(pair) != 2 or any(m not in registry.names() for m in pair):
        raise UserError(f"--modes: expected BASE,MODE from {', '.join(registry.names())}, got {args.modes!r}")
    profile = explanation_profiles[-1]
    if profile.device_type == "cuda" and not profile.device_name:
        return pair, None, "the trace names no GPU (no deviceProperties): no peak rate, so no ceiling"
    if profile.device_type == "cuda":
        (mode_peak, source), (base_peak, _) = peak_tflops(profile.device_name, pair[1]), peak_tflops(profile.device_name, pair[0])
        if not mode_peak or not base_peak:
            return pair, None, source
        return pair, mode_peak / base_peak, f"{source}: {mode_peak / base_peak:.3g}x"
    ratio, source = cpu_unit(pair[1], args.cpu_isa)
    return pair, ratio, source


def cmd_explain_traces(args, console) -> int:
    """`explain --trace A [--trace B]`: print the tables and the sentence; write the report."""
    from amp_bench.analysis.explain.any_trace import explain_traces, read_traces
    from amp_bench.report import explain_trace_report
    profiles = read_traces(args.trace)
    pair, ratio, source = _ceiling_inputs(args, profiles)
    explained = explain_traces(args.trace, pair, ratio, source, profiles)
    for heading, body in explain_trace_report._sections(explained):
        console.print(f"[bold]{escape(heading)}[/]")
        if hasattr(body, "to_string"):
            console.print(escape(body.round(3).to_string(index=False)), highlight=False, soft_wrap=True)
        else:
            for line in body:
                console.print(f"- {escape(line)}", highlight=False, soft_wrap=True)
    if not args.no_report:
        for kind, path in explain_trace_report.write(explained, args.reports_dir).items():
            console.print(f"{kind}: {path}", highlight=False, soft_wrap=True)
    return 0


def cmd_explain(args, console) -> int:
    from amp_bench.errors import UserError
    if args.trace:
        return cmd_explain_traces(args, console)
    if args.suite is None:
        raise UserError("explain: give a suite to run, or --trace TRACE.json[.gz] to read one")
    from amp_bench.cli import console as render_console
    from amp_bench.cli.run import _refuse_outer_torchrun, auto_report
    from amp_bench.studies.explain import explain_suite
    _refuse_outer_torchrun()
    overrides = {"batch_sizes": args.batch_size, "precisions": args.precision, "steps": args.steps,
                 "repeats": args.repeats, "budget_s": args.budget, "allow_emulated": args.allow_emulated}
    reporter = render_console.rich_reporter(console)
    try:
        explained = explain_suite(args.suite, device=args.device, results_dir=args.results_dir, reporter=reporter,
                                  **{k: v for k, v in overrides.items() if v is not None})
    except KeyboardInterrupt:
        reporter.close()
        console.print("[yellow]interrupted[/]: every finished case is saved; see the results directory above")
        return 130
    finally:
        reporter.close()
    for line in explained.unexplained:
        console.print(f"[yellow]not explained[/]: {escape(line)}", highlight=False, soft_wrap=True)
    if explained.nothing:
        console.print("[red]nothing to explain[/]: no case ran and profiled (see the lines above)")
        return EXIT_NOTHING_EXPLAINED
    console.print(breakdown_table(explained.results))
    for text in explained.sentences:
        console.print(f"- {escape(text)}", highlight=False, soft_wrap=True)
    run_dir = explained.results.attrs["run_dir"]
    console.print(f"traces (Perfetto opens them): {run_dir}/traces/")
    if not args.no_report:
        auto_report(run_dir, args.reports_dir, console)
    return 0
