"""The commands that read results and never run a model: `report`, `compare`, `history` and `ingest`,
with their options. None of them imports torch (the work is in report/, compare.py, history.py and
ingest.py, imported inside each command), so they run on a machine without it."""
from __future__ import annotations

from pathlib import Path

from amp_bench.cli import render
from amp_bench.errors import UserError


def add_parsers(sub) -> None:
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
    comp.add_argument("-o", "--output", type=Path,
                      help="path stem for .md, .json and .junit.xml (default reports/compare-CAND-vs-BASE)")
    comp.set_defaults(func=cmd_compare)

    hist = sub.add_parser("history", help="nightly series per case and machine, persistent changes; exit 1 on an "
                                          "unaccepted regression")
    hist.add_argument("results", nargs="+", help="a tree of run directories (or several, or globs)")
    hist.add_argument("--annotations", type=Path, help="accepted changes (default RESULTS/annotations.yaml)")
    hist.add_argument("--threshold-time", default="3%")
    hist.add_argument("--threshold-memory", default="2%")
    hist.add_argument("-o", "--output", type=Path, help="path stem for .md and .json (default reports/history)")
    hist.set_defaults(func=cmd_history)

    ing = sub.add_parser("ingest", help="import pytest-benchmark JSON files as run directories")
    ing.add_argument("files", nargs="+", type=Path)
    ing.add_argument("--results-dir", type=Path, default=Path("results"))
    ing.set_defaults(func=cmd_ingest)


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


def cmd_compare(args, console) -> int:
    from amp_bench.compare import Threshold, compare, write_outputs
    comparison = compare(
        args.baseline, args.candidate, force=args.force, seed=args.seed,
        threshold_time=Threshold.parse(args.threshold_time, "time"),
        threshold_throughput=Threshold.parse(args.threshold_throughput or args.threshold_time, "throughput"),
        threshold_memory=Threshold.parse(args.threshold_memory, "memory", allow_bytes=True))
    render.print_comparison(comparison, console)
    stem = args.output or Path("reports") / f"compare-{Path(args.candidate[0]).name}-vs-{Path(args.baseline[0]).name}"
    try:
        paths = write_outputs(comparison, Path(stem))
    except OSError as exc:
        raise UserError(f"{stem}: cannot write the comparison ({exc.strerror or exc})") from None
    console.print("wrote " + ", ".join(str(p) for p in paths.values()), highlight=False, soft_wrap=True)
    return comparison.exit_code


def cmd_history(args, console) -> int:
    from amp_bench.compare import Threshold
    from amp_bench.history import alerts, analyse, load_annotations, to_json, to_markdown
    from amp_bench.report.data import collect
    data = collect(args.results)
    annotations_path = args.annotations
    if annotations_path is None and len(args.results) == 1 and Path(args.results[0]).is_dir():
        default = Path(args.results[0]) / "annotations.yaml"
        annotations_path = default if default.exists() else None
    thresholds = {"step_time_ms": Threshold.parse(args.threshold_time, "time").relative,
                  "throughput": Threshold.parse(args.threshold_time, "time").relative,
                  "peak_mem_bytes": Threshold.parse(args.threshold_memory, "memory").relative}
    series, changes = analyse(data.results, load_annotations(annotations_path), thresholds)
    n_series = series[["case_id", "fingerprint"]].drop_duplicates().shape[0]
    console.print(f"{n_series} series over {series['run_id'].nunique()} runs"
                  + (f"; annotations: {annotations_path}" if annotations_path else ""), highlight=False)
    render.print_changes(changes, console)
    stem = Path(args.output or Path("reports") / "history")
    stem.parent.mkdir(parents=True, exist_ok=True)
    stem.with_name(stem.name + ".md").write_text(to_markdown(series, changes), encoding="utf-8")
    stem.with_name(stem.name + ".json").write_text(to_json(series, changes), encoding="utf-8")
    found = alerts(changes)
    console.print(f"{len(found)} alert(s); wrote {stem}.md and {stem}.json", highlight=False)
    if n_series and series.groupby(["case_id", "fingerprint"]).size().max() < 7:
        console.print("note: a change is confirmed only after 5 runs of history and 2 runs at the new level",
                      highlight=False)
    return 1 if found else 0


def cmd_ingest(args, console) -> int:
    from amp_bench.ingest import ingest
    for path in args.files:
        run_dir = ingest(path, args.results_dir)
        console.print(f"{path} -> {run_dir}", highlight=False, soft_wrap=True)
    return 0
