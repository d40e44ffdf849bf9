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
    run = sub.add_parser("run", help="run a suite and write results/<run-id>/ (here, or on SLURM partitions)")
    run.add_argument("suite", type=Path, nargs="?", help="the suite file (not with --resume)")
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
    run.add_argument("--isolation", choices=("fork", "spawn"), help="how each case's worker starts: fork (default), "
                     "a child of one server that imported torch and the models' libraries once; spawn, a fresh "
                     "interpreter per case (3-7 s of imports each)")
    run.add_argument("--on-contention", choices=("stop", "flag"), help="stop (default): a case whose worker other "
                     "processes hold under 85%% of its cores for 3 s is stopped as contended, with the evidence, "
                     "and retried once at the end if the machine is quiet then; flag: it runs on, its row says so")
    run.add_argument("--cpu-allocator", choices=("keep", "system"), help="keep (default): a CPU case's worker "
                     "keeps the memory it frees for reuse, so its steps do not page-fault their activations in "
                     "again; system: glibc's defaults, as a plain training script has them")
    run.add_argument("--peak-tflops", type=float, help="dense peak TFLOP/s for MFU, for every precision of the run "
                     "(overrides the built-in table; a suite's peak_tflops mapping sets one per precision)")
    run.add_argument("--no-report", action="store_true", help="don't write reports/<run-id>.html at the end")
    run.add_argument("--reports-dir", type=Path, default=Path("reports"))
    run.add_argument("--resume", type=Path, metavar="RUN_DIR", help="run the cases of RUN_DIR that have no row or "
                     "whose job died (a killed parent, Ctrl-C, a cancelled or preempted SLURM job), where it ran")
    run.add_argument("--try", nargs=2, metavar=("ADVICE", "RUN_DIR"), dest="try_advice",
                     help="measure an advice item of RUN_DIR's cases (a rule's name, or all: `explain RUN_DIR` lists "
                          "them) beside the case itself, in pairs, and print predicted against measured gain "
                          "(docs/advice.md)")
    add_executor_options(run)
    run.set_defaults(func=cmd_run)


def add_executor_options(parser) -> None:
    """--executor and the SLURM settings (the suite's `executor:` block takes the same, docs/cluster.md)."""
    group = parser.add_argument_group("where the cases run (docs/cluster.md)")
    group.add_argument("--executor", choices=("local", "slurm"), help="local: here (default); slurm: SLURM jobs "
                       "through submitit, one run directory per partition")
    group.add_argument("--slurm-partition", metavar="P1,P2", help="the partitions to run the suite on, each in full")
    group.add_argument("--slurm-gpus-per-node", type=int, metavar="N", help="GPUs per job (default: 1 on a "
                       "partition whose nodes have GPUs, else 0)")
    group.add_argument("--slurm-gres", help="a --gres request instead (e.g. gpu:a100:1)")
    group.add_argument("--slurm-constraint")
    group.add_argument("--slurm-account")
    group.add_argument("--slurm-qos")
    group.add_argument("--slurm-time", type=int, metavar="MINUTES", dest="slurm_time_min",
                       help="each job's time limit (default: its cases' timeouts added up, plus 10 minutes)")
    group.add_argument("--slurm-cpus-per-task", type=int)
    group.add_argument("--slurm-mem-gb", type=float)
    group.add_argument("--slurm-setup", action="append", metavar="LINE", help="repeatable: a shell line the job "
                       "runs first (module load cuda, source a venv)")
    group.add_argument("--slurm-exclusive", action=argparse.BooleanOptionalAction, default=None,
                       help="a node to itself (default: yes; a job beside a benchmark shares its CPU and PCIe)")
    group.add_argument("--slurm-tasks", type=int, metavar="N", help="jobs per partition, each with whole "
                       "model-and-batch groups (default 1)")
    group.add_argument("--slurm-cluster", choices=("slurm", "local"), help="local: submitit's local executor (the "
                       "jobs as processes on this machine: a dry run of a cluster run)")
    group.add_argument("--detach", action="store_true", help="submit and return: the jobs write their rows; "
                       "`amp_bench status RESULTS_DIR` shows progress, `run --resume RUN_DIR` what died")


def executor_overrides(args) -> dict:
    names = {"executor": "type", "slurm_partition": "partitions", "slurm_gpus_per_node": "gpus_per_node",
             "slurm_gres": "gres", "slurm_constraint": "constraint", "slurm_account": "account", "slurm_qos": "qos",
             "slurm_time_min": "time_min", "slurm_cpus_per_task": "cpus_per_task", "slurm_mem_gb": "mem_gb",
             "slurm_setup": "setup", "slurm_exclusive": "exclusive", "slurm_tasks": "tasks", "slurm_cluster": "cluster"}
    given = {field: getattr(args, option, None) for option, field in names.items()}
    if given["partitions"] is not None and given["type"] is None:
        given["type"] = "slurm"  # naming partitions means the cluster
    return {k: v for k, v in given.items() if v is not None}


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
    overrides = {"nproc_per_node": args.nproc_per_node, "steps": args.steps, "warmup_steps": args.warmup_steps,
                 "repeats": args.repeats, "batch_sizes": args.batch_size, "precisions": args.precision,
                 "timeout_s": args.timeout_s, "seed": args.seed, "peak_tflops": args.peak_tflops,
                 "target_ci": args.target_ci, "min_steps": args.min_steps, "max_steps": args.max_steps,
                 "case_budget_s": args.case_budget, "budget_s": args.budget, "allow_emulated": args.allow_emulated,
                 "compile": args.compile, "compile_backend": args.compile_backend,
                 "compile_fullgraph": args.compile_fullgraph, "compile_optimizer": args.compile_optimizer,
                 "compile_cache": args.compile_cache, "explain": args.explain, "isolation": args.isolation,
                 "on_contention": args.on_contention, "cpu_allocator": args.cpu_allocator}
    overrides = {k: v for k, v in overrides.items() if v is not None}
    from amp_bench.suite import executor_spec, load_suite
    spec = executor_spec(load_suite(args.suite).executor, executor_overrides(args), str(args.suite))
    if spec.remote:
        return _run_on_cluster(args, spec, overrides, console)
    unused = sorted(name for name in vars(args) if name.startswith("slurm_") and getattr(args, name) is not None)
    if unused or args.detach:  # said, not silently dropped: they shape SLURM jobs, and this run is local
        named = ", ".join([f"--{n.replace('_', '-').replace('-time-min', '-time')}" for n in unused]
                          + (["--detach"] if args.detach else []))
        verb = "applies" if len(unused) + bool(args.detach) == 1 else "apply"
        console.print(f"[yellow]note[/]: {named} {verb} to --executor slurm only; this run is local: not used",
                      highlight=False, soft_wrap=True)
    return _here(lambda reporter: run_suite(args.suite, device=args.device, results_dir=args.results_dir,
                                            reporter=reporter, **overrides),
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
        render_console.print_summary(results, console)
        _print_explained(results, console)
        _print_advice(results, console)
        _print_wall_time(results, console)
        _print_advice_scores(results, console)
        _print_predicted_gpus(results, console)
    if not args.no_report and not results.empty:
        auto_report(results.attrs["run_dir"], args.reports_dir, console)


def _run_on_cluster(args, spec, overrides, console) -> int:
    from amp_bench.studies.cluster import run_on_cluster
    runs = _reporting(render_console.cluster_reporter(console),
                      lambda reporter: run_on_cluster(args.suite, spec, device=args.device, reporter=reporter,
                                                      results_dir=args.results_dir, detach=args.detach, **overrides),
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
    """With explain on, what to change next: each case's advice items, ranked, and how to try each."""
    from rich.markup import escape

    from amp_bench.analysis.advice.for_run import advice_lines
    for line in advice_lines(results, results.attrs["run_dir"]):
        console.print(f"advice: {escape(line)}", highlight=False, soft_wrap=True)


def _print_predicted_gpus(results, console) -> None:
    """On a machine without a GPU the run ends with what its suite's GPU cases would give on GPUs
    (studies/gpu_predictions.py): predicted, said as such, never a measured row."""
    from amp_bench.cli.predict import predicted_gpus_table
    from amp_bench.studies.gpu_predictions import after_cpu_run
    run_dir = results.attrs["run_dir"]
    try:
        result = after_cpu_run(run_dir)
    except UserError as exc:
        console.print(f"On GPUs: not predicted: {exc.lines[0]}", highlight=False, soft_wrap=True)
        return
    if result is not None:
        predicted_gpus_table(result, run_dir, console)


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
