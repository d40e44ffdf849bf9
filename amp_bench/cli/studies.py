"""`amp_bench fidelity` and `amp_bench headroom`, the two studies beside the benchmark: their options
and commands. Each runs its study with a progress reporter, prints its table (console.py) and writes
the run's report like `run` does."""
from __future__ import annotations

from pathlib import Path

from rich.markup import escape

from amp_bench.cli import console as render_console
from amp_bench.cli.run import add_options, auto_report, note_slurm_only, overrides
from amp_bench.errors import UserError


def add_parsers(sub) -> None:
    _study_parser(sub, "fidelity", cmd_fidelity, "train on real shipped data under fp32 and each AMP mode; "
                  "compare held-out accuracy, loss curves and GradScaler health", "a suite with a fidelity: section")
    _study_parser(sub, "headroom", cmd_headroom,
                  "largest batch each precision trains at without running out of memory")


def _study_parser(sub, name: str, command, description: str, suite_help: str | None = None) -> None:
    study = sub.add_parser(name, help=description)
    study.add_argument("suite", type=Path, help=suite_help)
    study.add_argument("--device", help="auto (default: the suite's), cpu, cuda, cuda:N")
    study.add_argument("--results-dir", type=Path, default=Path("results"))
    add_options(study, name)
    study.add_argument("--no-report", action="store_true")
    study.add_argument("--reports-dir", type=Path, default=Path("reports"))
    add_options(study, name, executor=True)
    study.set_defaults(func=command)


def cmd_fidelity(args, console) -> int:
    from amp_bench.analysis.fidelity import failed_rows
    from amp_bench.studies.fidelity.orchestration import run_fidelity
    return _study(args, console, run_fidelity, render_console.fidelity_progress,
                  render_console.print_fidelity, failed_rows, "every finished precision is saved", "fidelity")


def cmd_headroom(args, console) -> int:
    from amp_bench.analysis.headroom import failed_rows
    from amp_bench.studies.headroom_search import run_headroom
    return _study(args, console, run_headroom, render_console.headroom_progress,
                  render_console.print_headroom, failed_rows, "every finished search is saved", "headroom")


def _study(args, console, run, progress, show, failed_rows, kept: str, kind: str) -> int:
    """Run a study with its progress display, print its table, write its report, exit on its rows.
    With --executor slurm, one job per partition runs it there (studies/cluster_study.py)."""
    from amp_bench.suite import executor_spec, load_suite
    spec = executor_spec(load_suite(args.suite).executor, overrides(args, kind, executor=True), str(args.suite))
    if spec.remote:
        return _study_on_cluster(args, console, spec, kind, overrides(args, kind), failed_rows)
    note_slurm_only(args, kind, console)
    try:
        table = run(args.suite, device=args.device, results_dir=args.results_dir, reporter=progress(console),
                    **overrides(args, kind))
    except KeyboardInterrupt:
        console.print(f"[yellow]interrupted[/]: {kept}; see the results directory above")
        return 130
    show(table, console)
    console.print(f"-> {table.attrs['run_dir']}", highlight=False, soft_wrap=True)
    if not args.no_report:
        auto_report(table.attrs["run_dir"], args.reports_dir, console)
    return _exit_for(failed_rows(table), console)


def _study_on_cluster(args, console, spec, kind: str, settings: dict, failed_rows) -> int:
    from amp_bench.studies.cluster_study import run_study_on_cluster
    say = lambda line: console.print(escape(line), highlight=False, soft_wrap=True)
    try:
        done = run_study_on_cluster(kind, args.suite, spec, device=args.device, results_dir=args.results_dir,
                                    detach=args.detach, say=say, **settings)
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/]: the jobs were cancelled; what they finished is saved")
        return 130
    if args.detach:
        console.print(f"detached: `python -m amp_bench status {args.results_dir}` shows the runs once they start",
                      highlight=False)
        return 0
    run_dirs = [d for d in done.values() if Path(d).is_dir()]
    failed = [f"{p}: {d}" for p, d in done.items() if not Path(d).is_dir()]
    if run_dirs:
        from amp_bench.analysis.fidelity import load_fidelity
        from amp_bench.analysis.headroom import load_headroom
        table = (load_fidelity if kind == "fidelity" else load_headroom)([Path(d) for d in run_dirs]).get(kind)
        if table is not None and not table.empty:
            failed += failed_rows(table)
        for partition, run_dir in done.items():
            console.print(f"{partition} -> {run_dir}", highlight=False, soft_wrap=True)
        if not args.no_report:
            auto_report(run_dirs, args.reports_dir, console)
    if not run_dirs and not failed:
        raise UserError(f"{kind}: no job returned a run directory")
    return _exit_for(failed, console)


def _exit_for(failed: list[str], console) -> int:
    """Unsupported modes are findings; a row that errored, timed out or ran out of memory fails the
    command (exit 1), so a script or the GPU check can't read a broken study as a pass."""
    if failed:
        console.print(f"[red]failed[/]: {escape('; '.join(failed))}", highlight=False, soft_wrap=True)
        return 1
    return 0
