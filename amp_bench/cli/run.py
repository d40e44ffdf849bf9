"""`amp_bench run`: its options, the refusal to run under an outer torchrun, and the command itself
(run the suite with a live progress display, print the summary tables, write the run's report).

Shared with explain, fidelity and headroom: their options that suite/options.py declares (add_options,
overrides, note_slurm_only) and auto_report, the report written at the end of a run."""
from __future__ import annotations

import argparse
import os
from pathlib import Path

from amp_bench.cli import console as render_console
from amp_bench.errors import UserError
from amp_bench.suite.options import taken_by

TARGET_HELP = ("comma-separated GPUs (predict --list-targets) to price the advice's changes on, from fake-tensor "
               "steps (default without a GPU: the suite's predict.targets, else v100-sxm2,a100-80gb,l4,h100-sxm); "
               "none: no GPU predictions (the fake-tensor recordings they need take seconds a case)")


def add_parsers(sub) -> None:
    run = sub.add_parser("run", help="run a suite and write results/<run-id>/ (here, or on SLURM partitions)")
    run.add_argument("suite", type=Path, nargs="?", help="the suite file (not with --resume)")
    run.add_argument("--device", choices=None, help="auto (default: the suite's, else auto), cpu, cuda, cuda:N")
    run.add_argument("--results-dir", type=Path, default=Path("results"))
    add_options(run, "run")
    run.add_argument("--target", help=TARGET_HELP)
    run.add_argument("--no-report", action="store_true", help="don't write reports/<run-id>.html at the end")
    run.add_argument("--reports-dir", type=Path, default=Path("reports"))
    run.add_argument("--resume", type=Path, metavar="RUN_DIR", help="run the cases of RUN_DIR that have no row or "
                     "whose job died (a killed parent, Ctrl-C, a cancelled or preempted SLURM job), where it ran")
    run.add_argument("--try", nargs=2, metavar=("ADVICE", "RUN_DIR"), dest="try_advice",
                     help="measure an advice item of RUN_DIR's cases (a rule's name, or all: `explain RUN_DIR` lists "
                          "them) beside the case itself, in pairs, and print predicted against measured gain "
                          "(docs/advice.md)")
    add_options(run, "run", executor=True)
    run.set_defaults(func=cmd_run)


def _add(parser, option) -> None:
    """One declared option, given as suite/options.py says (values.harden gives its value's check)."""
    switch = {"on": "store_true", "off": "store_false", "on_off": argparse.BooleanOptionalAction}.get(option.given)
    if switch is not None:
        parser.add_argument(option.flag, action=switch, default=None, help=option.help)
        return
    parser.add_argument(option.flag, action="append" if option.given == "values" else "store", help=option.help,
                        metavar=option.metavar, choices=option.choices,
                        **({"nargs": "?", "const": option.bare} if option.bare is not None else {}))


def add_options(parser, command: str, executor: bool = False) -> None:
    """The options of `command` that set a suite field (suite/options.py); with `executor`, those of where it
    runs, in their group (the suite's `executor:` block takes the same, docs/cluster.md)."""
    target = parser.add_argument_group("where the cases run (docs/cluster.md)") if executor else parser
    for option in taken_by(command):
        if (option.block == "executor") == executor:
            _add(target, option)


def overrides(args, command: str, executor: bool = False) -> dict:
    """The fields the command line set, by field: the study's settings, or with `executor` where it runs."""
    given = {o.setting: value for o in taken_by(command) if (o.block == "executor") == executor and o.setting
             and (value := getattr(args, o.dest)) is not None}
    if executor and "partitions" in given:
        given.setdefault("type", "slurm")  # naming partitions means the cluster
    return given


def note_slurm_only(args, command: str, console) -> None:
    """Options only a SLURM job honours, given to a run that stays here: said, not silently dropped."""
    named = [o.flag for o in taken_by(command) if o.slurm_only and getattr(args, o.dest) is not None]
    if named:
        this = "this run" if command == "run" else f"this {command} run"
        console.print(f"[yellow]note[/]: {', '.join(named)} {'applies' if len(named) == 1 else 'apply'} to "
                      f"--executor slurm only; {this} is local: not used", highlight=False, soft_wrap=True)


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
    if args.try_advice is not None:
        return _try(args, console)
    if args.resume is not None:
        if args.suite is not None:
            raise UserError("run --resume RUN_DIR takes no suite: it runs what RUN_DIR planned")
        return _resume(args, console)
    if args.suite is None:
        raise UserError("run: give a SUITE file, or --resume RUN_DIR")
    settings = overrides(args, "run")
    from amp_bench.suite import executor_spec, load_suite
    spec = executor_spec(load_suite(args.suite).executor, overrides(args, "run", executor=True), str(args.suite))
    if spec.remote:
        return _run_on_cluster(args, spec, settings, console)
    note_slurm_only(args, "run", console)
    return _here(lambda reporter: run_suite(args.suite, device=args.device, results_dir=args.results_dir,
                                            reporter=reporter, **settings),
                 args, console, "every finished case is saved; `run --resume RUN_DIR` runs the rest")


def _reporting(reporter, run, console, interrupted: str):
    """run(reporter), its live display closed however it ends; after Ctrl-C, `interrupted` said in one
    line and None (the caller exits 130: what finished is saved)."""
    try:
        return run(reporter)
    except KeyboardInterrupt:
        reporter.close()
        console.print(f"[yellow]interrupted[/]: {interrupted}")
        return None
    finally:
        reporter.close()


def _here(run, args, console, kept: str) -> int:
    """A run on this machine with the live progress display; Ctrl-C keeps what finished (exit 130)."""
    results = _reporting(render_console.rich_reporter(console), run, console, kept)
    if results is None:
        return 130
    _finish(results, args, console)
    return 0


def _finish(results, args, console) -> None:
    counts = results["status"].value_counts().to_dict()
    console.print(f"finished: {', '.join(f'{v} {k}' for k, v in counts.items())} -> {results.attrs['run_dir']}")
    if not results.empty:
        predicted = predict_on_gpus(results.attrs["run_dir"], args.target, console)  # the advice quotes its gains
        render_console.print_summary(results, console)
        _print_explained(results, console)
        _print_advice(results, console)
        _print_wall_time(results, console)
        _print_advice_scores(results, console)
        if predicted is not None:
            from amp_bench.cli.predict import predicted_gpus_table
            predicted_gpus_table(predicted, results.attrs["run_dir"], console)
    if not args.no_report and not results.empty:
        auto_report(results.attrs["run_dir"], args.reports_dir, console)


def _run_on_cluster(args, spec, settings, console) -> int:
    from amp_bench.studies.cluster import run_on_cluster
    runs = _reporting(render_console.cluster_reporter(console),
                      lambda reporter: run_on_cluster(args.suite, spec, device=args.device, reporter=reporter,
                                                      results_dir=args.results_dir, detach=args.detach, **settings),
                      console, "the jobs were cancelled; every finished case is saved (`run --resume RUN_DIR` runs "
                      "the rest)")
    return 130 if runs is None else _after_cluster(runs, args, console)


def _after_cluster(runs, args, console) -> int:
    if args.detach:
        for run in runs:
            console.print(f"submitted {run.partition}: jobs {', '.join(run.job_ids)} -> {run.store.dir}",
                          highlight=False, soft_wrap=True)
        console.print(f"detached: `python -m amp_bench status {args.results_dir}` shows progress", highlight=False)
        return 0
    from amp_bench.store.results import load_results
    for run in runs:
        console.print(f"[bold]{run.partition}[/]: {run.store.dir}", highlight=False, soft_wrap=True)
        try:
            render_console.print_summary(load_results(run.store.dir), console)
        except UserError as exc:
            console.print(f"  no results: {exc.lines[0]}", highlight=False)
    if not args.no_report and runs:
        auto_report([str(r.store.dir) for r in runs], args.reports_dir, console)
    return 0


def _resume(args, console) -> int:
    from amp_bench.store.results import read_manifest
    manifest = read_manifest(args.resume)
    if manifest is None:
        raise UserError(f"{args.resume}: not a run directory (no manifest.json)")
    if manifest.get("kind", "benchmark") != "benchmark":
        raise UserError(f"{args.resume}: a {manifest.get('kind')} run: only benchmark runs resume")
    if (manifest.get("executor") or {}).get("type", "local") == "slurm":
        from amp_bench.studies.cluster import resume
        run = _reporting(render_console.cluster_reporter(console),
                         lambda reporter: resume(args.resume, reporter=reporter, detach=args.detach), console,
                         "the jobs were cancelled; every finished case is saved")
        if run is None:
            return 130
        if not run.job_ids:
            console.print(f"nothing to resume: every case of {args.resume} has a row", highlight=False)
        return _after_cluster([run], args, console)
    from amp_bench.studies.resume import resume_local
    return _here(lambda reporter: resume_local(args.resume, reporter=reporter), args, console,
                 "every finished case is saved; `run --resume` again runs the rest")


def _print_explained(results, console) -> None:
    """With explain on, the run ends with why each speedup is what it is: one sentence per model, batch
    and mode (the full table is `explain SUITE`'s and the report's)."""
    if "explain_status" not in results or not results["explain_status"].isin(["ok", "distorted"]).any():
        return
    from rich.markup import escape

    from amp_bench.analysis.explain.decompose import sentences
    for text in sentences(results):
        console.print(f"why: {escape(text)}", highlight=False, soft_wrap=True)


def _try(args, console) -> int:
    """run --try ADVICE RUN_DIR: the item's rule and run checked in one line each, then the trial run."""
    from amp_bench.analysis.advice import RULES
    from amp_bench.store.results import read_manifest
    from amp_bench.studies.try_advice import run_trials
    rule, run_dir = args.try_advice
    names = [r.__name__ for r in RULES]
    if args.suite is not None or args.resume is not None:
        raise UserError("run --try ADVICE RUN_DIR takes no suite and no --resume: it tries RUN_DIR's own cases")
    if rule not in (*names, "all"):
        raise UserError(f"--try: unknown advice {rule!r} (one of {', '.join(names)}, or all)")
    if not Path(run_dir).is_dir() or read_manifest(run_dir) is None:
        raise UserError(f"--try: {run_dir} is not a run directory (no manifest.json)")
    return _here(lambda reporter: run_trials(run_dir, rule, repeats=args.repeats, results_dir=args.results_dir,
                                             reporter=reporter, on_contention=args.on_contention),
                 args, console, "every finished pair is saved in the new run directory")


def _print_advice_scores(results, console) -> None:
    """A trial run's end: each item's predicted gain beside the measured one."""
    for row in results.attrs.get("advice", []):
        interval = f" ({row['measured_low']:.2f}-{row['measured_high']:.2f}x)" if row["measured_low"] else \
            " (one pair: no interval)"
        busy = " [CONTENDED: the machine was shared; not a trustworthy figure]" if row["contended"] else ""
        measured = (f"measured {row['measured_speedup']:.2f}x{interval} from {row['pairs']} pair(s); error "
                    f"{row['error']:+.0%}{busy}" if row["measured_speedup"] else "not measured (no pair)")
        console.print(f"tried {row['rule']} on {row['case_id']}: predicted {row['predicted_speedup']:.2f}x "
                      f"({row['predicted_low']:.2f}-{row['predicted_high']:.2f}x), {measured}", highlight=False,
                      soft_wrap=True)


def _print_advice(results, console) -> None:
    """With explain on, what to change next: each case's advice items, ranked, and how to try each; then each
    change the GPU cases could take, priced on GPUs (predict_on_gpus)."""
    from rich.markup import escape

    from amp_bench.analysis.advice.for_run import advice_lines
    for line in advice_lines(results, results.attrs["run_dir"]):
        console.print(f"advice: {escape(line)}", highlight=False, soft_wrap=True)
    print_gpu_advice(results.attrs["run_dir"], console)


def print_gpu_advice(run_dir, console) -> None:
    """Each change the GPU cases could take and its predicted gain per GPU (predicted_advice.csv)."""
    from rich.markup import escape

    from amp_bench.analysis.advice.for_run import GPU_TABLE
    from amp_bench.analysis.advice.targets import gpu_lines
    from amp_bench.store.results import read_table
    gpus = read_table([run_dir], GPU_TABLE)
    if not gpus.empty:
        console.print("advice on GPUs (predicted from fake-tensor steps, nothing measured here; docs/advice.md):")
    for line in gpu_lines(gpus) if not gpus.empty else []:
        console.print(f"  {escape(line)}", highlight=False, soft_wrap=True)


def predict_on_gpus(run_dir, targets: list[str] | None, console):
    """On a machine without a GPU, what its suite's GPU cases would give on GPUs (studies/gpu_predictions.py,
    returned for the run's table) and what each change they could take would give there (studies/gpu_advice.py,
    predicted_advice.csv, which the advice lines quote); on a GPU run, the changes only, with --target.
    Predictions, said as such, never a measured row. `targets` empty (--target none): nothing predicted."""
    if targets is not None and not targets:
        console.print("On GPUs: not predicted (--target none)", highlight=False)
        return None
    from amp_bench.studies import gpu_advice
    from amp_bench.studies.gpu_predictions import after_cpu_run
    try:
        predicted = after_cpu_run(run_dir, targets=targets)
        gpu_advice.for_run(run_dir, targets)
    except UserError as exc:
        console.print(f"On GPUs: not predicted: {exc.lines[0]}", highlight=False, soft_wrap=True)
        return None
    return predicted


def _print_wall_time(results, console) -> None:
    """Where the workers' time went, and the slowest workers' largest phases (analysis/wall_time.py)."""
    from rich.markup import escape

    from amp_bench.analysis.wall_time import run_lines
    for line in run_lines(results):
        console.print(escape(line), highlight=False, soft_wrap=True)


def auto_report(run_dir, reports_dir: Path, console) -> None:
    """The run's report (a list: the runs of a cluster run, one per partition, in one report); a missing
    plotly or an unwritable folder never costs the measured results."""
    from amp_bench.report import build_report
    try:
        import plotly  # noqa: F401
    except ImportError:
        console.print("report skipped: plotly is not installed (results are saved; "
                      "`python -m amp_bench report` renders them elsewhere)", highlight=False)
        return
    run_dirs = [run_dir] if isinstance(run_dir, (str, Path)) else list(run_dir)
    name = Path(run_dirs[0]).name if len(run_dirs) == 1 else f"{Path(run_dirs[0]).name}-and-{len(run_dirs) - 1}-more"
    run_dir = " ".join(map(str, run_dirs))
    try:
        written = build_report(run_dirs, reports_dir / f"{name}.html")
    except UserError as exc:
        console.print(f"report skipped: {exc.lines[0]}", highlight=False)
        return
    except Exception as exc:  # the results are saved; a report bug must not end in a traceback
        first = str(exc).splitlines()[0] if str(exc) else ""
        console.print(f"report failed ({type(exc).__name__}: {first}); the results are saved: "
                      f"`python -m amp_bench report {run_dir}` retries", highlight=False, soft_wrap=True)
        return
    console.print(f"report: {written['html']}", highlight=False, soft_wrap=True)
