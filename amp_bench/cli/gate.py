"""The regression gate's commands, `history` and `nightly`, with their options; printing with rich.
Neither imports torch."""
from __future__ import annotations

from pathlib import Path

from rich.markup import escape

from amp_bench.errors import UserError


def _thresholds(args) -> dict[str, float]:
    from amp_bench.analysis.compare import Threshold
    time = Threshold.parse(args.threshold_time, "time").relative
    return {"step_time_ms": time, "throughput": time,
            "peak_mem_bytes": Threshold.parse(args.threshold_memory, "memory").relative}


def _print_contended(console, contended) -> None:
    """Contended runs are left out of the series: say so, and which series were not judged tonight."""
    from amp_bench.analysis.gate.history import TONIGHT_CONTENDED
    if contended.empty:
        return
    console.print(f"[yellow]contended[/]: {len(contended)} case runs left out of the series "
                  "(a busy machine's figures are not comparable)", highlight=False)
    for _, r in contended[contended["latest"]].head(30).iterrows():
        console.print(f"[yellow]{TONIGHT_CONTENDED}[/]: {escape(str(r['hostname'] or r['fingerprint']))} "
                      f"{escape(str(r['case_id']))} {r['run_id']} ({escape(str(r['contention']))})",
                      highlight=False, soft_wrap=True)


def cmd_history(args, console) -> int:
    from rich.table import Table

    from amp_bench.analysis.gate.history import evaluate, load_annotations, series_keys, to_json, to_markdown
    from amp_bench.store.cache import load_cached
    results = load_cached(args.results, use_cache=not getattr(args, "no_cache", False))
    annotations_path = args.annotations
    if annotations_path is None and len(args.results) == 1 and Path(args.results[0]).is_dir():
        default = Path(args.results[0]) / "annotations.yaml"
        annotations_path = default if default.exists() else None
    result = evaluate(results, load_annotations(annotations_path), _thresholds(args), annotations_path=annotations_path)
    series = result.series
    console.print(f"{series[series_keys()].drop_duplicates().shape[0]} series over "
                  f"{series['run_id'].nunique()} runs, {len(result.changes)} changes in their history"
                  + (f"; annotations: {annotations_path}" if annotations_path else ""), highlight=False)
    for warning in result.warnings:
        console.print(f"[yellow]warning[/]: {escape(warning)}", highlight=False, soft_wrap=True)
    _print_contended(console, result.contended)
    if result.red:
        table = Table("case", "machine", "metric", "since", "change", "against", title="red now", title_justify="left")
        for s in result.red[:50]:
            table.add_row(escape(s.case_id), escape(s.hostname or s.fingerprint), s.metric,
                          f"{s.since_date} {s.since_run}", f"[red]{s.ratio - 1:+.1%}[/]", s.against)
        console.print(table)
    recent = sorted(result.changes, key=lambda c: c.date, reverse=True)[:20]
    if recent:
        table = Table("date", "case", "machine", "metric", "from run", "change", "kind", "accepted",
                      title="latest changes in the history", title_justify="left")
        for c in recent:
            colour = "red" if c.kind == "regression" and not c.accepted else "green"
            table.add_row(c.date, escape(c.case_id), c.fingerprint, c.metric, c.run_id, f"{c.ratio - 1:+.1%}",
                          f"[{colour}]{c.kind}[/]", f"yes: {escape(c.note)}" if c.accepted else "no")
        console.print(table)
    stem = Path(args.output or Path("reports") / "history")
    try:
        stem.parent.mkdir(parents=True, exist_ok=True)
        stem.with_name(stem.name + ".md").write_text(to_markdown(result), encoding="utf-8")
        stem.with_name(stem.name + ".json").write_text(to_json(result), encoding="utf-8")
    except OSError as exc:
        raise UserError(f"{stem}: cannot write the history ({exc.strerror or exc})") from None
    console.print(f"{result.red_series} red series ({len(result.red)} red metrics); wrote {stem}.md and {stem}.json",
                  highlight=False)
    return 1 if result.red else 0


def add_parsers(subparsers) -> None:
    hist = subparsers.add_parser("history", help="nightly series per case and machine, changes with dates; exit 1 "
                                                 "while a series is red (worse than its accepted level)")
    hist.add_argument("results", nargs="+", help="a tree of run directories (or several, or globs)")
    hist.add_argument("--annotations", type=Path, help="accepted changes (default RESULTS/annotations.yaml)")
    hist.add_argument("--threshold-time", default="3%")
    hist.add_argument("--threshold-memory", default="2%")
    hist.add_argument("-o", "--output", type=Path, help="path stem for .md and .json (default reports/history)")
    hist.add_argument("--no-cache", action="store_true", help="read every CSV (no .amp_bench_cache)")
    hist.set_defaults(func=cmd_history)

    p = subparsers.add_parser("nightly", help="tonight's run of every machine and suite vs its accepted baseline "
                                              "and history; exit 0 green, 1 red, 2 usage, 3 no verdict")
    p.add_argument("results", type=Path, help="the shared results tree")
    p.add_argument("--accept", action="store_true", help="move the accepted baseline to tonight's run "
                   "(of --machine / --suite, default all) in RESULTS/baselines.yaml")
    p.add_argument("--machine", help="with --accept: a fingerprint or host name (glob)")
    p.add_argument("--suite", help="with --accept: a suite name (glob)")
    p.add_argument("--note", help="with --accept: why")
    p.add_argument("--annotations", type=Path, help="accepted changes (default RESULTS/annotations.yaml)")
    p.add_argument("--threshold-time", default="3%")
    p.add_argument("--threshold-memory", default="2%")
    p.add_argument("--max-age", type=float, default=2.0, help="days a machine may go without a run (default 2)")
    p.add_argument("--dashboard", type=Path, help="also write the static HTML dashboard here")
    p.add_argument("--no-cache", action="store_true", help="read every CSV (no .amp_bench_cache)")
    p.add_argument("-o", "--output", type=Path,
                   help="path stem for .md, .json, .junit.xml (default reports/nightly-DATE)")
    p.set_defaults(func=cmd_nightly)


def cmd_nightly(args, console) -> int:
    import datetime as dt

    from rich.table import Table

    from amp_bench.analysis.gate import nightly as gate
    if (args.machine or args.suite or args.note) and not args.accept:
        raise UserError("--machine, --suite and --note go with --accept (what it moves, and why); pass --accept")
    if args.accept:
        for entry in gate.accept(args.results, args.machine, args.suite, args.note or "", use_cache=not args.no_cache):
            console.print(f"accepted {entry['run']} for {entry['host'] or entry['machine']} / {entry['suite']}",
                          highlight=False)
    result = gate.nightly(args.results, _thresholds(args), args.max_age, args.annotations, use_cache=not args.no_cache)
    table = Table("machine", "suite", "tonight", "baseline", "series", "red", "no verdict",
                  title=f"nightly: {result.summary}", title_justify="left")
    for g in sorted(result.groups, key=lambda g: (-g.red, g.hostname, g.suite)):
        missing = ("stale " if g.stale else "") + (f"{len(g.missing)} missing" if g.missing else "") \
            + (f"{' ' if g.stale or g.missing else ''}{len(g.contended)} contended" if g.contended else "") \
            + (f" run {g.unfinished.split(':')[0]}" if g.unfinished else "")
        table.add_row(escape(g.hostname or g.fingerprint), escape(g.suite), g.tonight, g.baseline or "first night",
                      str(g.series), f"[red]{g.red}[/]" if g.red else "0", missing or "-")
    console.print(table)
    for s in result.red[:30]:
        console.print(f"[red]red[/]: {escape(s.hostname or s.fingerprint)} {escape(s.case_id)} {s.metric} "
                      f"{s.ratio - 1:+.1%} vs {s.against} level since {s.since_date}", highlight=False, soft_wrap=True)
    for warning in result.history.warnings:
        console.print(f"[yellow]warning[/]: {escape(warning)}", highlight=False, soft_wrap=True)
    for g in result.groups:
        if g.unfinished:
            console.print(f"[yellow]tonight's run did not finish: no verdict[/]: {escape(g.hostname or g.fingerprint)} "
                          f"{escape(g.suite)} {g.tonight} is {escape(g.unfinished)}", highlight=False, soft_wrap=True)
        if g.contended:
            console.print(f"[yellow]tonight's run was contended: not judged[/]: {escape(g.hostname or g.fingerprint)} "
                          f"{escape(g.suite)} {g.tonight} ({escape(g.contention or 'no reason recorded')}; "
                          f"{len(g.contended)} cases)", highlight=False, soft_wrap=True)
    stem = args.output or Path("reports") / f"nightly-{dt.datetime.now(dt.timezone.utc):%Y-%m-%d}"
    try:
        paths = gate.write_outputs(result, Path(stem))
        if args.dashboard:
            from amp_bench.report.dashboard import write_dashboard
            paths["dashboard"] = write_dashboard(result, args.dashboard)
    except OSError as exc:
        raise UserError(f"{stem}: cannot write the nightly outputs ({exc.strerror or exc})") from None
    console.print("wrote " + ", ".join(str(p) for p in paths.values()), highlight=False, soft_wrap=True)
    return result.exit_code
