"""`amp_bench fidelity` and `amp_bench headroom`, the two studies beside the benchmark: their options
and commands. Each runs its study with a progress reporter, prints its table (console.py) and writes
the run's report like `run` does."""
from __future__ import annotations

from pathlib import Path

from rich.markup import escape

from amp_bench.cli import console as render_console
from amp_bench.cli.run import add_executor_options, auto_report, executor_overrides
from amp_bench.errors import UserError


def add_parsers(sub) -> None:
    fid = sub.add_parser("fidelity", help="train on real shipped data under fp32 and each AMP mode; compare "
                                          "held-out accuracy, loss curves and GradScaler health")
    fid.add_argument("suite", type=Path, help="a suite with a fidelity: section")
    fid.add_argument("--device", help="auto (default: the suite's), cpu, cuda, cuda:N")
    fid.add_argument("--results-dir", type=Path, default=Path("results"))
    fid.add_argument("--epochs", type=int)
    fid.add_argument("--batch-size", type=int)
    fid.add_argument("--seed", type=int, action="append", help="repeatable; replaces the section's seeds")
    fid.add_argument("--precision", action="append", help="repeatable; fp32 always runs as the reference")
    fid.add_argument("--tolerance-pp", type=float, help="accuracy difference (percentage points) still called parity")
    fid.add_argument("--no-report", action="store_true")
    fid.add_argument("--reports-dir", type=Path, default=Path("reports"))
    add_executor_options(fid)
    fid.set_defaults(func=cmd_fidelity)

    head = sub.add_parser("headroom", help="largest batch each precision trains at without running out of memory")
    head.add_argument("suite", type=Path)
    head.add_argument("--device", help="auto (default: the suite's), cpu, cuda, cuda:N")
    head.add_argument("--results-dir", type=Path, default=Path("results"))
    head.add_argument("--memory-cap-gb", type=float, help="GPU: allocator cap; CPU: address space above bare torch")
    head.add_argument("--start-batch-size", type=int)
    head.add_argument("--max-batch-size", type=int)
    head.add_argument("--resolution", type=int, help="stop bisecting when fit and OOM are this close (default 1)")
    head.add_argument("--precision", action="append", help="repeatable; replaces precisions")
    head.add_argument("--timeout-s", type=float, help="per probe")
    head.add_argument("--no-measure", action="store_true", help="skip the throughput measurement at each maximum")
    head.add_argument("--no-report", action="store_true")
    head.add_argument("--reports-dir", type=Path, default=Path("reports"))
    add_executor_options(head)
    head.set_defaults(func=cmd_headroom)


def cmd_fidelity(args, console) -> int:
    from amp_bench.analysis.fidelity import failed_rows
    from amp_bench.studies.fidelity.orchestration import run_fidelity
    overrides = {"epochs": args.epochs, "seeds": args.seed, "precisions": args.precision,
                 "tolerance_pp": args.tolerance_pp, "batch_size": args.batch_size}
    return _study(args, console, run_fidelity, overrides, render_console.fidelity_progress,
                  render_console.print_fidelity, failed_rows, "every finished precision is saved", "fidelity")


def cmd_headroom(args, console) -> int:
    from amp_bench.analysis.headroom import failed_rows
    from amp_bench.studies.headroom_search import run_headroom
    overrides = {"memory_cap_gb": args.memory_cap_gb, "max_batch_size": args.max_batch_size,
                 "start_batch_size": args.start_batch_size, "resolution": args.resolution, "precisions": args.precision,
                 "measure": False if args.no_measure else None, "timeout_s": args.timeout_s}
    return _study(args, console, run_headroom, overrides, render_console.headroom_progress,
                  render_console.print_headroom, failed_rows, "every finished search is saved", "headroom")


def _study(args, console, run, overrides: dict, progress, show, failed_rows, kept: str, kind: str) -> int:
    """Run a study with its progress display, print its table, write its report, exit on its rows.
    With --executor slurm, one job per partition runs it there (studies/cluster_study.py)."""
    from amp_bench.suite import executor_spec, load_suite
    spec = executor_spec(load_suite(args.suite).executor, executor_overrides(args), str(args.suite))
    unused = [{"slurm_time_min": "--slurm-time"}.get(k, f"--{k.replace('_', '-')}") for k, v in vars(args).items()
              if k.startswith("slurm_") and v is not None]
    if not spec.remote and (unused or args.detach):
        console.print(f"[yellow]note[/]: {' '.join(unused + (['--detach'] if args.detach else []))}: not used: "
                      f"this {kind} runs here (executor local)", highlight=False, soft_wrap=True)
    if spec.remote:
        return _study_on_cluster(args, console, spec, kind, {k: v for k, v in overrides.items() if v is not None},
                                 failed_rows)
    try:
        table = run(args.suite, device=args.device, results_dir=args.results_dir, reporter=progress(console),
                    **{k: v for k, v in overrides.items() if v is not None})
    except KeyboardInterrupt:
        console.print(f"[yellow]interrupted[/]: {kept}; see the results directory above")
        return 130
    show(table, console)
    console.print(f"-> {table.attrs['run_dir']}", highlight=False, soft_wrap=True)
    if not args.no_report:
        auto_report(table.attrs["run_dir"], args.reports_dir, console)
    return _exit_for(failed_rows(table), console)


def _study_on_cluster(args, console, spec, kind: str, overrides: dict, failed_rows) -> int:
    from amp_bench.studies.cluster_study import run_study_on_cluster
    say = lambda line: console.print(escape(line), highlight=False, soft_wrap=True)
    try:
        done = run_study_on_cluster(kind, args.suite, spec, device=args.device, results_dir=args.results_dir,
                                    detach=args.detach, say=say, **overrides)
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
