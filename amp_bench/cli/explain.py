"""`explain SUITE`: run a suite with `explain: true` (studies/explain_suite.py) and print where each case's step
time went, per category and mode, with one sentence per model and batch. Cases without a breakdown (failed,
unsupported, profile unavailable) get one line each; none at all exits non-zero.
`explain --trace A [--trace B]`: the same reading of any torch.profiler / Kineto trace, and of B against A."""
from __future__ import annotations

from pathlib import Path

from rich.markup import escape
from rich.table import Table

from amp_bench.cli.run import TARGET_HELP, add_options, overrides
from amp_bench.suite.options import taken_by

EXIT_NOTHING_EXPLAINED = 3


def add_parsers(sub) -> None:
    explain = sub.add_parser("explain", help="run a suite with one profiled step per case and say where the time "
                                             "goes (GEMM, conv, elementwise, casts, ...) and why the speedup is what "
                                             "it is")
    explain.add_argument("suite", type=Path, nargs="?", help="a suite to run (or --trace to read traces instead)")
    explain.add_argument("--trace", type=Path, action="append", metavar="TRACE.json[.gz]",
                         help="read a torch.profiler / Kineto trace instead of running a suite; twice: the second "
                              "against the first")
    explain.add_argument("--modes", metavar="BASE,MODE", help="with two traces: the precision each ran (e.g. "
                         "fp32,amp_bf16), for the ceiling")
    explain.add_argument("--cpu-isa", help="with two CPU traces: the CPU's flags (e.g. avx512_bf16 or "
                         "amx_bf16), for the ceiling")
    explain.add_argument("--device", help="auto (default: the suite's, else auto), cpu, cuda, cuda:N")
    explain.add_argument("--results-dir", type=Path, help="where the run directory goes (default: results)")
    add_options(explain, "explain")
    explain.add_argument("--target", help=TARGET_HELP)
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
    columns = list(dict.fromkeys(zip(long["case"], long["precision"], strict=True)))
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


TRACE_ONLY = ("modes", "cpu_isa")


def _given(args, names) -> list[str]:
    """The options among `names` the command line set (their defaults are None)."""
    return [f"--{n.replace('_', '-')}" for n in names if getattr(args, n, None) not in (None, False)]


def _cell(value) -> str:
    if value is None or value != value:
        return "-"
    return f"{value:.3f}" if isinstance(value, float) else escape(str(value))


def _frame_table(frame) -> Table:
    """A pandas table as a rich one (never pandas' own print): numbers to 3 decimals, blanks as '-'. The
    per-trace summary is turned on its side, a column per trace, so a terminal does not wrap it."""
    if "trace" in frame.columns:
        table = Table("", *[escape(str(t)) for t in frame["trace"]], show_edge=False)
        for column in frame.columns.drop("trace"):
            table.add_row(escape(str(column)), *[_cell(v) for v in frame[column]])
        return table
    table = Table(*[escape(str(c)) for c in frame.columns], show_edge=False)
    for values in frame.itertuples(index=False):
        table.add_row(*[_cell(v) for v in values])
    return table


def _trace_notes(args, profiles) -> list[str]:
    """One line for each trace option this reading has no use for."""
    notes = []
    if len(profiles) == 1 and (args.modes or args.cpu_isa):
        notes.append(f"{' and '.join(_given(args, TRACE_ONLY))}: not used with one trace (they price the second "
                     "trace's ceiling against the first's)")
    elif args.cpu_isa and profiles[0].device_type != "cpu":
        notes.append("--cpu-isa: not used with GPU traces (their GPU's peak rates price the ceiling)")
    return notes


def cmd_explain_traces(args, console) -> int:
    """`explain --trace A [--trace B]`: print the tables and the sentence; write the report."""
    from amp_bench.analysis.explain.any_trace import explain_traces, read_traces
    from amp_bench.errors import UserError
    from amp_bench.report import explain_trace_report
    suite_only = _given(args, ("results_dir", "device", *(option.dest for option in taken_by("explain"))))
    if args.suite is not None or suite_only:
        what = " and ".join(suite_only + (["a suite"] if args.suite is not None else []))
        raise UserError(f"explain --trace reads traces: {what} applies to a suite run (explain SUITE)")
    profiles = read_traces(args.trace)
    for line in _trace_notes(args, profiles):
        console.print(f"[yellow]note[/]: {escape(line)}", highlight=False, soft_wrap=True)
    explained = explain_traces(args.trace, args.modes, args.cpu_isa, profiles)
    for heading, body in explain_trace_report._sections(explained):
        console.print(f"[bold]{escape(heading)}[/]")
        if hasattr(body, "columns"):
            console.print(_frame_table(body))
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
    if _given(args, TRACE_ONLY):
        raise UserError(f"explain SUITE: {' and '.join(_given(args, TRACE_ONLY))} applies to two traces "
                        "(explain --trace A --trace B)")
    from amp_bench.cli import console as render_console
    from amp_bench.cli.run import (
        _print_advice,
        _refuse_outer_torchrun,
        _reporting,
        auto_report,
        predict_on_gpus,
        print_gpu_advice,
    )
    from amp_bench.studies.explain_suite import explain_suite
    _refuse_outer_torchrun()
    explained = _reporting(render_console.rich_reporter(console),
                           lambda reporter: explain_suite(args.suite, device=args.device, reporter=reporter,
                                                          results_dir=args.results_dir or Path("results"),
                                                          **overrides(args, "explain")),
                           console, "every finished case is saved; see the results directory above")
    if explained is None:
        return 130
    run_dir = explained.results.attrs["run_dir"]
    predict_on_gpus(run_dir, args.target, console)  # each change the GPU cases could take, priced on GPUs
    for line in explained.unexplained:
        console.print(f"[yellow]not explained[/]: {escape(line)}", highlight=False, soft_wrap=True)
    if explained.nothing:
        print_gpu_advice(run_dir, console)
        console.print("[red]nothing to explain[/]: no case ran and profiled (see the lines above)")
        return EXIT_NOTHING_EXPLAINED
    console.print(breakdown_table(explained.results))
    for text in explained.sentences:
        console.print(f"- {escape(text)}", highlight=False, soft_wrap=True)
    _print_advice(explained.results, console)  # what to change next (docs/advice.md)
    console.print(f"traces (Perfetto opens them): {run_dir}/traces/")
    if not args.no_report:
        auto_report(run_dir, args.reports_dir, console)
    return 0
