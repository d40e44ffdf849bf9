"""Command line: run, fidelity, headroom, report, compare, history, nightly, ingest, validate, list-models, env.
Rendering only; the work is in runner.py, fidelity.py, headroom.py and the other modules."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.markup import escape

from amp_bench.errors import UserError


def _fmt_bytes(value) -> str:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return "-"
    if value != value:  # NaN
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.3g} {unit}"
        value /= 1024
    return "-"


def _fmt(value, spec: str, suffix: str = "") -> str:
    try:
        if value is None or value != value:
            return "-"
        return f"{value:{spec}}{suffix}"
    except (TypeError, ValueError):
        return "-"


def _reporter_base():
    from amp_bench.runner import Reporter
    return Reporter


class RichReporter(_reporter_base()):
    """Progress per case and per step, a line per finished case, warnings pyperf-style."""

    def __init__(self, console):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
        self.console = console
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=console, transient=True)
        self.run_task = None
        self.case_task = None

    def run_started(self, store, device, total):
        self.console.print(f"[bold]device[/]: {device.name} ({device.architecture})   "
                           f"[bold]results[/]: {store.dir}")
        self.progress.start()
        self.run_task = self.progress.add_task("cases", total=total)

    def case_started(self, case, repeat, index, total):
        label = f"{case.case_id} r{repeat}"
        if self.case_task is not None:
            self.progress.remove_task(self.case_task)
        self.case_task = self.progress.add_task(f"  {label}: starting", total=case.warmup_steps + case.steps)

    def worker_event(self, case, event):
        if event.get("event") == "phase":
            self.progress.update(self.case_task, description=f"  {case.case_id}: {event['phase']}")
        elif event.get("event") == "step":
            self.progress.update(self.case_task, completed=event["step"] + 1)

    def case_finished(self, case, row):
        self.progress.advance(self.run_task)
        status = row.get("status")
        colour = {"ok": "green", "unsupported": "dim", "nonfinite": "yellow"}.get(status, "red")
        if status == "ok":
            memory = row.get("peak_mem_allocated_bytes") if row.get("device") == "cuda" else row.get("peak_rss_bytes")
            detail = (f"{_fmt(row.get('step_time_ms_median'), '.1f', ' ms/step')}  "
                      f"{_fmt(row.get('throughput'), '.1f', ' samples/s')}  "
                      f"cv {_fmt(row.get('step_time_cv'), '.1%')}  peak {_fmt_bytes(memory)}")
            if row.get("scaler_skipped_steps"):
                detail += f"  scaler skipped {row['scaler_skipped_steps']}"
        else:
            detail = escape(str(row.get("reason", "")))
        self.console.print(f"[{colour}]{status:>11}[/] {escape(case.case_id)} r{row.get('repeat')}  {detail}",
                           highlight=False)
        for warning in filter(None, str(row.get("warnings") or "").split(" | ")):
            if warning != "nan":
                self.console.print(f"            [yellow]warning:[/] {escape(warning)}", highlight=False)

    def close(self):
        self.progress.stop()


def _summary_table(results, console) -> None:
    """One table per model: each precision's step time, speedup and memory saving vs fp32."""
    from rich import box
    from rich.table import Table

    from amp_bench.summary import summarize
    summary = summarize(results)
    for (model, device_name), table in summary.groupby(["model_label", "device_name"], sort=False):
        cpu = (table["device"] == "cpu").all()
        show_layout = table["channels_last"].astype(bool).any()
        show_tf32 = table["speedup_vs_tf32"].notna().any()
        show_procs = (table["world_size"] > 1).any()
        out = Table(title=f"{model} on {device_name}: medians across repeats", title_justify="left",
                    box=box.SIMPLE_HEAD, pad_edge=False)
        columns = ["bs"] + (["layout"] if show_layout else []) + (["procs"] if show_procs else []) + \
            ["precision", "ms/step", "samples/s", "vs fp32"] + (["vs tf32"] if show_tf32 else []) + \
            (["scaling eff"] if show_procs else []) + \
            ["peak RSS" if cpu else "peak alloc", "saved"] + (["saved*"] if cpu else [])
        for name in columns:
            out.add_column(name, justify="left" if name in ("layout", "precision") else "right", no_wrap=True)
        for _, r in table.iterrows():
            ok = r["status"] == "ok"
            cells = [str(int(r["batch_size"]))] + (["cl" if r["channels_last"] else "nchw"] if show_layout else [])
            cells += [str(int(r["world_size"]))] if show_procs else []
            cells += [r["precision"], _fmt(r["step_time_ms"], ".1f") if ok else escape(r["status"]),
                      _fmt(r["throughput"], ".1f"), _fmt(r["speedup_vs_fp32"], ".2f", "x")]
            if show_tf32:
                cells.append(_fmt(r["speedup_vs_tf32"], ".2f", "x"))
            if show_procs:
                cells.append(_fmt(r["scaling_efficiency"], ".0%"))
            cells += [_fmt_bytes(r["peak_mem_bytes"]), _fmt(r["mem_saving_vs_fp32"], ".1%")]
            if cpu:
                cells.append(_fmt(r["mem_saving_above_baseline_vs_fp32"], ".1%"))
            out.add_row(*cells)
        console.print(out)
    if (summary["world_size"] > 1).any():
        console.print("[dim]procs: DDP world size; weak scaling (per-process batch fixed, samples/s global); "
                      "scaling eff = step time with 1 process / step time with procs (docs/distributed.md)[/]")
    if (summary["device"] == "cpu").any():
        console.print("[dim]CPU memory is the worker's peak RSS; saved* leaves out the RSS before the model was "
                      "built (the torch runtime's own footprint)[/]")


def _refuse_outer_torchrun() -> None:
    """`torchrun -m amp_bench run` would start N orchestrators, each launching every case: refuse."""
    import os
    if "TORCHELASTIC_RUN_ID" in os.environ or ("RANK" in os.environ and "WORLD_SIZE" in os.environ):
        raise UserError(f"amp_bench run is running under torchrun (RANK={os.environ.get('RANK')}, WORLD_SIZE="
                        f"{os.environ.get('WORLD_SIZE')}); amp_bench starts torchrun itself for each case: set "
                        "nproc_per_node (and nnodes) in the suite or pass --nproc-per-node, and run "
                        "`python -m amp_bench run SUITE` (see docs/distributed.md)")


def cmd_run(args, console) -> int:
    from amp_bench.runner import run_suite
    _refuse_outer_torchrun()
    overrides = {"nproc_per_node": args.nproc_per_node,"steps": args.steps, "warmup_steps": args.warmup_steps, "repeats": args.repeats,
                 "batch_sizes": args.batch_size, "precisions": args.precision, "timeout_s": args.timeout_s,
                 "seed": args.seed, "peak_tflops": args.peak_tflops}
    reporter = RichReporter(console)
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
    _summary_table(results, console)
    if not args.no_report:
        _auto_report(results.attrs["run_dir"], args.reports_dir, console)
    return 0


def _auto_report(run_dir: str, reports_dir: Path, console) -> None:
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


def cmd_fidelity(args, console) -> int:
    from rich import box
    from rich.table import Table

    from amp_bench.fidelity import FidelityReporter, run_fidelity

    class Progress(FidelityReporter):
        def started(self, store, device, spec):
            console.print(f"[bold]fidelity[/]: {spec.model} on {spec.dataset}, {spec.epochs} epochs x "
                          f"{len(spec.seeds)} seed(s), batch {spec.batch_size}, on {device.name}   "
                          f"[bold]results[/]: {store.dir}", highlight=False, soft_wrap=True)

        def precision_finished(self, precision, rows):
            if rows and len({(r.get("status"), r.get("reason")) for r in rows}) == 1 and rows[0].get("status") != "ok":
                seeds = ", ".join(str(r["seed"]) for r in rows)  # alike for every seed: say it once
                console.print(f"{rows[0]['status']:>11} {precision} (seeds {seeds})  {escape(str(rows[0].get('reason')))}",
                              highlight=False)
                return
            for r in rows:
                detail = (f"test accuracy {r['test_accuracy']:.2%}, final train loss {r['final_train_loss']:.4f}"
                          if r.get("status") == "ok" else escape(str(r.get("reason", ""))))
                console.print(f"{r.get('status', '?'):>11} {precision} seed {r['seed']}  {detail}", highlight=False)

    overrides = {"epochs": args.epochs, "seeds": args.seed, "precisions": args.precision,
                 "tolerance_pp": args.tolerance_pp, "batch_size": args.batch_size}
    try:
        runs = run_fidelity(args.suite, device=args.device, results_dir=args.results_dir, reporter=Progress(),
                            **{k: v for k, v in overrides.items() if v is not None})
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/]: every finished precision is saved; see the results directory above")
        return 130
    verdicts = runs.attrs["verdicts"]
    health = runs.groupby("precision", sort=False).agg(
        skips=("scaler_skipped_steps", "sum"), min_scale=("scaler_min_scale", "min"),
        lost=("grad_underflow_fraction_unscaled", "max"), lost_scaled=("grad_underflow_fraction_scaled", "max"))
    has_scaler, has_probe = health["min_scale"].notna().any(), health["lost"].notna().any()
    table = Table(title=f"held-out accuracy against fp32 (tolerance +/-{verdicts['tolerance_pp'].iloc[0]:g} pp)"
                  + ("; grads lost: share of gradient elements zero under autocast, unscaled->scaled"
                     if has_probe else ""), title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    columns = ["precision", "seeds", "acc", "diff pp", "fp32 range pp", "train loss"]
    columns += (["skips", "min scale"] if has_scaler else []) + (["grads lost"] if has_probe else []) + ["verdict"]
    for name in columns:  # narrow terminals wrap rather than cut a figure short
        table.add_column(name, no_wrap=name in ("precision", "verdict"), overflow="fold",
                         justify="left" if name in ("precision", "verdict") else "right")
    colours = {"parity": "green", "worse": "red", "better": "yellow"}
    for _, v in verdicts.iterrows():
        h = health.loc[v["precision"]]
        verdict = f"[{colours[v['verdict']]}]{v['verdict']}[/]" if v["verdict"] in colours else escape(v["verdict"])
        cells = [v["precision"], str(v["seeds"]), _fmt(v["test_accuracy"], ".2%"), _fmt(v["accuracy_diff_pp"], "+.2f"),
                 _fmt(v["fp32_seed_range_pp"], ".2f"), _fmt(v["final_train_loss"], ".4f")]
        if has_scaler:
            cells += [_fmt(h["skips"], ".0f") if h["min_scale"] == h["min_scale"] else "-", _fmt(h["min_scale"], ".4g")]
        if has_probe:
            cells.append(f"{_fmt(h['lost'], '.3%')}->{_fmt(h['lost_scaled'], '.3%')}" if h["lost"] == h["lost"] else "-")
        table.add_row(*cells, verdict)
    console.print(table)
    if (runs["scaler_scale_below_one"] == True).any():  # noqa: E712 - NaN for runs without a scaler
        console.print("[red]warning[/]: the loss scale fell below 1: gradients overflow fp16 even unscaled",
                      highlight=False)
    console.print(f"-> {runs.attrs['run_dir']}", highlight=False, soft_wrap=True)
    if not args.no_report:
        _auto_report(runs.attrs["run_dir"], args.reports_dir, console)
    return 0


def cmd_headroom(args, console) -> int:
    from rich import box
    from rich.table import Table

    from amp_bench.headroom import HeadroomReporter, run_headroom

    class Progress(HeadroomReporter):
        def started(self, store, device, spec, searches):
            cap = f"{spec.memory_cap_bytes / 2**30:.3g} GiB" if spec.memory_cap_bytes else "none (the whole device)"
            if (store.manifest.get("headroom") or {}).get("default_cpu_cap"):
                cap += " (default: half the memory available now, shared by DDP ranks)"
            console.print(f"[bold]headroom[/]: {searches} searches on {device.name}, memory cap {cap}, batch "
                          f"{spec.start_batch_size}..{spec.max_batch_size}, resolution {spec.resolution}   "
                          f"[bold]results[/]: {store.dir}", highlight=False, soft_wrap=True)

        def probe_finished(self, case, batch, row):
            colour = {"ok": "green", "oom": "yellow"}.get(row["status"], "red")
            console.print(f"  probe {escape(case.model.label)} {case.precision} batch {batch}: "
                          f"[{colour}]{row['status']}[/]", highlight=False)

    overrides = {"memory_cap_gb": args.memory_cap_gb, "max_batch_size": args.max_batch_size,
                 "start_batch_size": args.start_batch_size, "resolution": args.resolution,
                 "precisions": args.precision, "measure": False if args.no_measure else None,
                 "timeout_s": args.timeout_s}
    try:
        table = run_headroom(args.suite, device=args.device, results_dir=args.results_dir, reporter=Progress(),
                             **{k: v for k, v in overrides.items() if v is not None})
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/]: every finished search is saved; see the results directory above")
        return 130
    procs = table["nproc_per_node"].notna().any()
    out = Table(title="largest batch that trains (and samples/s at it), against fp32", title_justify="left",
                box=box.SIMPLE_HEAD, pad_edge=False)
    for name in ("model", *(["procs"] if procs else []), "precision", "largest", "first OOM", "x fp32",
                 "samples/s", "x fp32 ", "probes", "status"):
        out.add_column(name, no_wrap=name == "precision", overflow="fold",
                       justify="left" if name in ("model", "precision", "status") else "right")
    for _, r in table.iterrows():
        largest = _fmt(r["max_batch_size"], ".0f") + (" (limit)" if r["limit_reached"] else "")
        ratio = ("≥" if r["batch_ratio_is_lower_bound"] else "") + _fmt(r["batch_ratio_vs_fp32"], ".2f", "x")
        out.add_row(escape(r["model_label"]), *([_fmt(r["world_size"], ".0f")] if procs else []), r["precision"],
                    largest, _fmt(r["first_oom_batch_size"], ".0f"), ratio, _fmt(r["throughput_at_max"], ".1f"),
                    _fmt(r["throughput_ratio_vs_fp32"], ".2f", "x"), str(r["probes"]),
                    r["status"] if r["status"] == "ok" else f"{r['status']}: {escape(str(r['reason']))}")
    console.print(out)
    console.print(f"-> {table.attrs['run_dir']}", highlight=False, soft_wrap=True)
    if not args.no_report:
        _auto_report(table.attrs["run_dir"], args.reports_dir, console)
    return 0


def cmd_report(args, console) -> int:
    from amp_bench.report import build_report
    formats = tuple(f.strip() for f in args.format.split(",") if f.strip())
    unknown = [f for f in formats if f not in ("html", "md", "csv")]
    if unknown or not formats:
        raise UserError(f"--format: expected a comma-separated list of html, md, csv, got {args.format!r}")
    written = build_report(args.results, args.output, formats, args.images)
    for kind, path in written.items():
        if kind == "images" and isinstance(path, str):
            console.print(path, highlight=False, soft_wrap=True)
        elif kind == "images":
            console.print(f"images: {len(path)} files in {path[0].parent if path else '-'}", highlight=False)
        else:
            console.print(f"{kind}: {path}", highlight=False, soft_wrap=True)
    return 0


def cmd_validate(args, console) -> int:
    from amp_bench.suite import load_suite
    failed = []
    for path in args.suites:
        try:
            suite = load_suite(path)
        except UserError as exc:
            failed.extend(exc.lines)
            continue
        parts = [f"{len(suite.cases(d))} cases x {suite.settings_for(d)['repeats']} repeats on {d}"
                 for d in ("cuda", "cpu") if suite.has_matrix]
        for d in ("cuda", "cpu"):  # load_suite has checked every section already; this only describes
            if suite.section("fidelity", d) is not None:
                spec = suite.fidelity_spec(d)
                parts.append(f"fidelity on {d}: {spec.model} on {spec.dataset}, {len(spec.precisions)} "
                             f"precisions x {len(spec.seeds)} seeds")
            if suite.section("headroom", d) is not None:
                parts.append(f"headroom section on {d}")
        counts = ", ".join(parts)
        console.print(f"{path}: ok ({counts})", highlight=False, soft_wrap=True)
    if failed:
        raise UserError(failed)
    return 0


def cmd_list_models(args, console) -> int:
    from amp_bench.models import torchvision_names, transformers_types
    if args.kind in (None, "torchvision"):
        names = torchvision_names()
        console.print(f"[bold]torchvision/<name>[/] ({len(names)}, weights=None):")
        console.print("  " + "  ".join(names), highlight=False)
    if args.kind in (None, "transformers"):
        types = transformers_types()
        console.print(f"[bold]transformers/<model_type>[/] ({len(types)}, built from config; default task):")
        console.print("  " + "  ".join(f"{k}[dim]({v})[/]" for k, v in sorted(types.items())), highlight=False)
    if args.kind in (None, "python"):
        console.print("[bold]python:<module>:<callable>[/]: callable(**options) -> (model, make_batch, loss_fn); "
                      "make_batch(batch_size, device) -> (inputs, target); loss_fn(output, target) -> loss")
    return 0


def cmd_env(args, console) -> int:
    import json

    from rich.table import Table

    from amp_bench.environment import fingerprint_columns, host_facts
    from amp_bench.session import probe
    info = probe(args.device)
    info["host"] = host_facts()
    info["fingerprint"] = fingerprint_columns(info["device"], info["versions"], info.get("gpu", {}),
                                              info["host"]["hostname"])
    if args.json:
        print(json.dumps(info, indent=2, default=str))
        return 0
    device, gpu, fp = info["device"], info.get("gpu", {}), info["fingerprint"]
    line = f"[bold]device[/]: {escape(device['name'])} ({info['architecture']}"
    if device.get("capability"):
        line += f", compute capability {fp['compute_capability']}, {device['total_memory_bytes'] / 2**30:.0f} GiB"
    console.print(line + ")", highlight=False)
    if device["type"] == "cuda":
        nvml = gpu.get("nvml") or "ok"
        console.print(f"[bold]gpu[/]: driver {gpu.get('driver_version') or '-'}, uuid {gpu.get('gpu_uuid') or '-'}, "
                      f"power limit {gpu.get('power_limit_w') or '-'} W, persistence {gpu.get('persistence_mode')}, "
                      f"MIG {gpu.get('mig_mode')}; NVML: {escape(str(nvml))}", highlight=False)
    console.print(f"[bold]cpu[/]: {escape(device['cpu_model'])}, {fp['cpu_count']} cores; bf16/fp16 ISA: "
                  f"{fp['cpu_bf16_isa']}", highlight=False)
    console.print("  ".join(f"{k.replace('_version', '')} {v}" for k, v in info["versions"].items() if v),
                  highlight=False)
    software = info.get("software", {})
    console.print(f"[bold]fingerprint[/]: {fp['fingerprint']}   git: {software.get('git_commit', '-')}   "
                  f"pip packages: {len(software.get('pip_freeze', []))}"
                  + ("   conda env: recorded" if software.get("conda_env") else ""), highlight=False)
    if info["host"]["env"]:
        console.print("[bold]env[/]: " + " ".join(f"{k}={v}" for k, v in info["host"]["env"].items()), highlight=False)
    table = Table("precision", "runs here", "why")
    for mode, support in info["support"].items():
        runs = "yes" if support["supported"] else ("only with allow_emulated" if support["emulated"] else "no")
        table.add_row(mode, runs, escape(support["reason"]) or "-")
    console.print(table)
    return 0


def cmd_compare(args, console) -> int:
    from rich.table import Table

    from amp_bench.compare import Threshold, compare, write_outputs
    comparison = compare(
        args.baseline, args.candidate, force=args.force, seed=args.seed, history=args.history,
        threshold_time=Threshold.parse(args.threshold_time, "time"),
        threshold_throughput=Threshold.parse(args.threshold_throughput or args.threshold_time, "throughput"),
        threshold_memory=Threshold.parse(args.threshold_memory, "memory", allow_bytes=True))
    table = Table("case", "metric", "baseline", "candidate", "ratio", "95% CI", "p (MWU)", "verdict",
                  title=f"candidate vs baseline: {comparison.summary}", title_justify="left")
    colours = {"regression": "red", "improvement": "green", "unstable": "yellow", "not enough data": "dim"}
    for r in comparison.results:
        colour = colours.get(r.verdict, "")
        verdict = f"[{colour}]{r.verdict}[/]" if colour else r.verdict
        table.add_row(escape(r.case_id), r.metric, _fmt(r.baseline, ".4g"), _fmt(r.candidate, ".4g"),
                      _fmt(r.ratio, ".3f"), f"{_fmt(r.ci_low, '.3f')}-{_fmt(r.ci_high, '.3f')}",
                      _fmt(r.p_value, ".2g"), verdict)
    console.print(table)
    for note in comparison.notes + comparison.unmatched:
        console.print(f"note: {escape(note)}", highlight=False, soft_wrap=True)
    stem = args.output or Path("reports") / f"compare-{Path(args.candidate[0]).name}-vs-{Path(args.baseline[0]).name}"
    try:
        paths = write_outputs(comparison, Path(stem))
    except OSError as exc:
        raise UserError(f"{stem}: cannot write the comparison ({exc.strerror or exc})") from None
    console.print("wrote " + ", ".join(str(p) for p in paths.values()), highlight=False, soft_wrap=True)
    return comparison.exit_code


def cmd_history(args, console) -> int:
    from amp_bench.gate_cli import cmd_history as run_history
    return run_history(args, console)


def cmd_ingest(args, console) -> int:
    from amp_bench.ingest import ingest
    for path in args.files:
        run_dir = ingest(path, args.results_dir)
        console.print(f"{path} -> {run_dir}", highlight=False, soft_wrap=True)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="amp_bench", description="Measure what PyTorch AMP buys in training.")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run a suite and write results/<run-id>/")
    run.add_argument("suite", type=Path)
    run.add_argument("--device", choices=None, help="auto (default: the suite's, else auto), cpu, cuda, cuda:N")
    run.add_argument("--results-dir", type=Path, default=Path("results"))
    run.add_argument("--steps", type=int)
    run.add_argument("--warmup-steps", type=int)
    run.add_argument("--repeats", type=int)
    run.add_argument("--batch-size", type=int, action="append", help="repeatable; replaces batch_sizes")
    run.add_argument("--precision", action="append", help="repeatable; replaces precisions")
    run.add_argument("--timeout-s", type=float)
    run.add_argument("--nproc-per-node", type=int, action="append",
                     help="repeatable; replaces nproc_per_node: run each case with DDP under torchrun on this "
                          "many processes (e.g. --nproc-per-node 1 --nproc-per-node 2)")
    run.add_argument("--seed", type=int)
    run.add_argument("--peak-tflops", type=float, help="dense peak TFLOP/s for MFU, for every precision of the run "
                     "(overrides the built-in table; a suite's peak_tflops mapping sets one per precision)")
    run.add_argument("--no-report", action="store_true", help="don't write reports/<run-id>.html at the end")
    run.add_argument("--reports-dir", type=Path, default=Path("reports"))
    run.set_defaults(func=cmd_run)

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
    head.set_defaults(func=cmd_headroom)

    report = sub.add_parser("report", help="HTML report, markdown summary and CSV tables from results")
    report.add_argument("results", nargs="+", help="run directories, trees of them, or globs")
    report.add_argument("-o", "--output", type=Path, help="the HTML path (default reports/<run-id or merged>.html); "
                        "the .md and .csv files go next to it")
    report.add_argument("--format", default="html,md,csv", help="comma-separated: html, md, csv (default: all)")
    report.add_argument("--images", choices=("png", "svg"), help="also export each chart (needs kaleido)")
    report.set_defaults(func=cmd_report)

    comp = sub.add_parser("compare", help="is CANDIDATE slower or bigger than BASELINE? exit 0 no, 1 regression, "
                                          "2 usage error, 3 not enough data, 4 too unstable to decide")
    comp.add_argument("baseline", nargs=1, help="a run directory (or a tree / glob of runs pooled as one side)")
    comp.add_argument("candidate", nargs=1)
    comp.add_argument("--threshold-time", default="3%", help="step-time regression threshold (default 3%%)")
    comp.add_argument("--threshold-throughput", help="default: the time threshold")
    comp.add_argument("--threshold-memory", default="2%", help="a percentage, or bytes such as 0B or 64MiB")
    comp.add_argument("--force", action="store_true", help="compare even when the machine fingerprints differ")
    comp.add_argument("--seed", type=int, default=0, help="bootstrap seed (results are reproducible)")
    comp.add_argument("--history", help="a results tree: add each series' night-to-night noise to the intervals "
                      "(and decide with fewer than 3 repeats)")
    comp.add_argument("-o", "--output", type=Path,
                      help="path stem for .md, .json and .junit.xml (default reports/compare-CAND-vs-BASE)")
    comp.set_defaults(func=cmd_compare)

    hist = sub.add_parser("history", help="nightly series per case and machine, changes with dates; exit 1 while a "
                                          "series is red (worse than its accepted level)")
    hist.add_argument("results", nargs="+", help="a tree of run directories (or several, or globs)")
    hist.add_argument("--annotations", type=Path, help="accepted changes (default RESULTS/annotations.yaml)")
    hist.add_argument("--threshold-time", default="3%")
    hist.add_argument("--threshold-memory", default="2%")
    hist.add_argument("-o", "--output", type=Path, help="path stem for .md and .json (default reports/history)")
    hist.add_argument("--no-cache", action="store_true", help="read every CSV (no .amp_bench_cache)")
    hist.set_defaults(func=cmd_history)

    from amp_bench.gate_cli import add_nightly_parser
    add_nightly_parser(sub)

    ing = sub.add_parser("ingest", help="import pytest-benchmark JSON files as run directories")
    ing.add_argument("files", nargs="+", type=Path)
    ing.add_argument("--results-dir", type=Path, default=Path("results"))
    ing.set_defaults(func=cmd_ingest)

    validate = sub.add_parser("validate", help="check suite files without running them")
    validate.add_argument("suites", nargs="+", type=Path)
    validate.set_defaults(func=cmd_validate)

    models = sub.add_parser("list-models", help="model references that resolve here")
    models.add_argument("--kind", choices=("torchvision", "transformers", "python"))
    models.set_defaults(func=cmd_list_models)

    env = sub.add_parser("env", help="this machine's device and which precision modes it supports, and why")
    env.add_argument("--device", default="auto")
    env.add_argument("--json", action="store_true", help="the whole record as JSON, for machines")
    env.set_defaults(func=cmd_env)
    return parser


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console
    args = build_parser().parse_args(argv)
    console = Console()
    try:
        return args.func(args, console)
    except UserError as exc:
        err = Console(stderr=True)
        for line in exc.lines:
            err.print(f"[red]error[/]: {escape(line)}", highlight=False, soft_wrap=True)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
