"""`amp_bench run`: its options, the refusal to run under an outer torchrun, and the command itself
(run the suite with a live progress display, print the summary tables, write the run's report).

auto_report, the report written at the end of a run, lives here too; fidelity and headroom end with it."""
from __future__ import annotations

import argparse
import os
from pathlib import Path

from amp_bench.cli import console as render_console
from amp_bench.errors import UserError


def add_parsers(sub) -> None:
    run = sub.add_parser("run", help="run a suite and write results/<run-id>/")
    run.add_argument("suite", type=Path)
    run.add_argument("--device", choices=None, help="auto (default: the suite's, else auto), cpu, cuda, cuda:N")
    run.add_argument("--results-dir", type=Path, default=Path("results"))
    run.add_argument("--steps", type=int, help="a fixed number of measured steps per case")
    run.add_argument("--target-ci", type=float, help="measure each case until the 95%% interval of its median "
                     "step time is within +-this share of it (e.g. 0.01), its budget is spent or --max-steps")
    run.add_argument("--min-steps", type=int, help="adaptive window: never fewer measured steps")
    run.add_argument("--max-steps", type=int, help="adaptive window: never more measured steps")
    run.add_argument("--case-budget", type=float, metavar="SECONDS", help="measuring budget per case and repeat")
    run.add_argument("--budget", type=float, metavar="SECONDS", help="the whole run's budget, shared out among the "
                     "cases still to run (a case's min_steps wins over it)")
    run.add_argument("--allow-emulated", action="store_true", default=None, help="also run modes this hardware "
                     "only emulates (bf16/fp16 on a CPU without the ISA, bf16 below Ampere); labelled emulated")
    run.add_argument("--warmup-steps", type=int)
    run.add_argument("--repeats", type=int)
    run.add_argument("--batch-size", type=int, action="append", help="repeatable; replaces batch_sizes")
    run.add_argument("--precision", action="append", help="repeatable; replaces precisions")
    run.add_argument("--timeout-s", type=float)
    run.add_argument("--nproc-per-node", type=int, action="append",
                     help="repeatable; replaces nproc_per_node: run each case with DDP under torchrun on this "
                          "many processes (e.g. --nproc-per-node 1 --nproc-per-node 2)")
    run.add_argument("--compile", action="append", nargs="?", const="true", metavar="MODE",
                     help="repeatable; replaces the compile axis: false (eager), true/default, reduce-overhead, "
                     "max-autotune (e.g. --compile false --compile true); alone it means the default mode, as "
                     "compile: true does in a suite")
    run.add_argument("--compile-backend", help="torch.compile backend (default inductor)")
    run.add_argument("--compile-fullgraph", action="store_true", default=None, help="fullgraph=True: a graph "
                     "break fails the case (status compile_error)")
    run.add_argument("--compile-optimizer", action="store_true", default=None, help="compile the optimizer step too")
    run.add_argument("--compile-cache", choices=("warm", "cold"), help="inductor/triton cache: warm, one per run "
                     "shared by its cases; cold, an empty one per case")
    run.add_argument("--seed", type=int)
    run.add_argument("--explain", action=argparse.BooleanOptionalAction, default=None, help="profile one more step "
                     "per case after its window: where the time goes, per category (on by default; the suite key "
                     "explain: false or --no-explain turns it off)")
    run.add_argument("--peak-tflops", type=float, help="dense peak TFLOP/s for MFU, for every precision of the run "
                     "(overrides the built-in table; a suite's peak_tflops mapping sets one per precision)")
    run.add_argument("--no-report", action="store_true", help="don't write reports/<run-id>.html at the end")
    run.add_argument("--reports-dir", type=Path, default=Path("reports"))
    run.set_defaults(func=cmd_run)


def _refuse_outer_torchrun() -> None:
    """`torchrun -m amp_bench run` would start N orchestrators, each launching every case: refuse."""
    if "TORCHELASTIC_RUN_ID" in os.environ or ("RANK" in os.environ and "WORLD_SIZE" in os.environ):
        raise UserError(f"amp_bench run is running under torchrun (RANK={os.environ.get('RANK')}, WORLD_SIZE="
                        f"{os.environ.get('WORLD_SIZE')}); amp_bench starts torchrun itself for each case: set "
                        "nproc_per_node (and nnodes) in the suite or pass --nproc-per-node, and run "
                        "`python -m amp_bench run SUITE` (see docs/distributed.md)")


def cmd_run(args, console) -> int:
    from amp_bench.studies.benchmark import run_suite
    _refuse_outer_torchrun()
    overrides = {"nproc_per_node": args.nproc_per_node, "steps": args.steps, "warmup_steps": args.warmup_steps,
                 "repeats": args.repeats, "batch_sizes": args.batch_size, "precisions": args.precision,
                 "timeout_s": args.timeout_s, "seed": args.seed, "peak_tflops": args.peak_tflops,
                 "target_ci": args.target_ci, "min_steps": args.min_steps, "max_steps": args.max_steps,
                 "case_budget_s": args.case_budget, "budget_s": args.budget, "allow_emulated": args.allow_emulated,
                 "compile": args.compile, "compile_backend": args.compile_backend,
                 "compile_fullgraph": args.compile_fullgraph, "compile_optimizer": args.compile_optimizer,
                 "compile_cache": args.compile_cache, "explain": args.explain}
    reporter = render_console.rich_reporter(console)
    try:
        results = run_suite(args.suite, device=args.device, results_dir=args.results_dir, reporter=reporter,
                            **{k: v for k, v in overrides.items() if v is not None})
    except KeyboardInterrupt:
        reporter.close()
        console.print("[yellow]interrupted[/]: every finished case is saved; see the results directory above")
        return 130
    finally:
        reporter.close()
    counts = results["status"].value_counts().to_dict()
    console.print(f"finished: {', '.join(f'{v} {k}' for k, v in counts.items())} -> {results.attrs['run_dir']}")
    render_console.print_summary(results, console)
    _print_explained(results, console)
    if not args.no_report:
        auto_report(results.attrs["run_dir"], args.reports_dir, console)
    return 0


def _print_explained(results, console) -> None:
    """With explain on, the run ends with why each speedup is what it is: one sentence per model, batch
    and mode (the full table is `explain SUITE`'s and the report's)."""
    if "explain_status" not in results or not results["explain_status"].isin(["ok", "distorted"]).any():
        return
    from rich.markup import escape

    from amp_bench.analysis.explain.decompose import sentences
    for text in sentences(results):
        console.print(f"why: {escape(text)}", highlight=False, soft_wrap=True)


def auto_report(run_dir: str, reports_dir: Path, console) -> None:
    """The run's report; a missing plotly or an unwritable folder never costs the measured results."""
    from amp_bench.report import build_report
    try:
        import plotly  # noqa: F401
    except ImportError:
        console.print("report skipped: plotly is not installed (results are saved; "
                      "`python -m amp_bench report` renders them elsewhere)", highlight=False)
        return
    try:
        written = build_report([run_dir], reports_dir / f"{Path(run_dir).name}.html")
    except UserError as exc:
        console.print(f"report skipped: {exc.lines[0]}", highlight=False)
        return
    except Exception as exc:  # noqa: BLE001 - the results are saved; a report bug must not end in a traceback
        first = str(exc).splitlines()[0] if str(exc) else ""
        console.print(f"report failed ({type(exc).__name__}: {first}); the results are saved: "
                      f"`python -m amp_bench report {run_dir}` retries", highlight=False, soft_wrap=True)
        return
    console.print(f"report: {written['html']}", highlight=False, soft_wrap=True)
