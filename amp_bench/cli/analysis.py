"""The commands that read results and never run a model: `report`, `compare`, `export` and `ingest`,
with their options. None of them imports torch (the work is in report/, analysis/ and store/,
imported inside each command), so they run on a machine without it."""
from __future__ import annotations

from pathlib import Path

from amp_bench.cli import console as render_console
from amp_bench.errors import UserError


def add_parsers(sub) -> None:
    report = sub.add_parser("report", help="HTML report, markdown summary and CSV tables from results")
    report.add_argument("results", nargs="+", help="run directories, trees of them, or globs")
    report.add_argument("-o", "--output", type=Path, help="the HTML path (default reports/<run-id or merged>.html); "
                        "the .md and .csv files go next to it")
    report.add_argument("--format", default="html,md,csv", help="comma-separated: html, md, csv (default: all)")
    report.add_argument("--images", choices=("png", "svg"), help="also export each chart (needs kaleido)")
    report.add_argument("--prices", type=Path, metavar="PRICES.yaml", help="price per GPU-hour by GPU name (or a "
                        "part of it, or a partition): samples per $ in 'GPUs compared' (no prices are built in)")
    report.add_argument("--reference", metavar="GPU", help="divide every GPU's samples/s by this GPU's, mode by mode "
                        "(a GPU's name, or a unique part of it)")
    report.set_defaults(func=cmd_report)

    comp = sub.add_parser("compare", help="is CANDIDATE slower or bigger than BASELINE? exit 0 no, 1 regression (or "
                                          "a mode unsupported in the candidate), 2 usage error, 3 not enough data "
                                          "(or not comparable: contended), 4 too unstable to decide")
    comp.add_argument("baseline", nargs=1, help="a run directory (or a tree / glob of runs pooled as one side)")
    comp.add_argument("candidate", nargs=1)
    comp.add_argument("--threshold-time", default="3%", help="step-time regression threshold (default 3%%)")
    comp.add_argument("--threshold-throughput", help="default: the time threshold")
    comp.add_argument("--threshold-speedup", default="5%", help="the paired speedup over fp32 (what AMP buys) "
                      "lower by more than this is a regression (default 5%%)")
    comp.add_argument("--threshold-memory", default="2%", help="a percentage, or bytes such as 0B or 64MiB")
    comp.add_argument("--force", action="store_true", help="compare even when the machine fingerprints differ")
    comp.add_argument("--seed", type=int, default=0, help="bootstrap seed (results are reproducible)")
    comp.add_argument("--history", help="a results tree: add each series' night-to-night noise to the intervals "
                      "(and decide with fewer than 3 repeats)")
    comp.add_argument("-o", "--output", type=Path,
                      help="path stem for .md, .json and .junit.xml (default reports/compare-CAND-vs-BASE)")
    comp.set_defaults(func=cmd_compare)

    exp = sub.add_parser("export", help="results for other tools: Bencher Metric Format JSON (bmf) or Apache "
                                        "Otava CSVs with their otava.yaml (otava)")
    exp.add_argument("results", help="a run directory or a tree of them")
    exp.add_argument("--format", required=True, choices=("bmf", "otava"))
    exp.add_argument("-o", "--output", type=Path, help="bmf: a file (default: standard output); otava: a folder "
                     "(default reports/otava)")
    exp.add_argument("--machine", help="one machine of a tree of several (host [partition], host or fingerprint)")
    exp.set_defaults(func=cmd_export)

    ing = sub.add_parser("ingest", help="import pytest-benchmark JSON files as run directories")
    ing.add_argument("files", nargs="+", type=Path)
    ing.add_argument("--results-dir", type=Path, default=Path("results"))
    ing.set_defaults(func=cmd_ingest)


def cmd_report(args, console) -> int:
    from amp_bench.report import build_report
    formats = tuple(dict.fromkeys(args.format))  # checked where it was read (cli/values.py)
    written = build_report(args.results, args.output, formats, args.images, prices=args.prices,
                           reference=args.reference)
    for kind, path in written.items():
        if kind == "images" and isinstance(path, str):
            console.print(path, highlight=False, soft_wrap=True)
        elif kind == "images":
            console.print(f"images: {len(path)} files in {path[0].parent if path else '-'}", highlight=False)
        else:
            console.print(f"{kind}: {path}", highlight=False, soft_wrap=True)
    return 0


def cmd_compare(args, console) -> int:
    from amp_bench.analysis.compare import Threshold, compare, write_outputs
    comparison = compare(
        args.baseline, args.candidate, force=args.force, seed=args.seed, history=args.history,
        threshold_time=Threshold.parse(args.threshold_time, "time"),
        threshold_throughput=Threshold.parse(args.threshold_throughput or args.threshold_time, "throughput"),
        threshold_speedup=Threshold.parse(args.threshold_speedup, "speedup"),
        threshold_memory=Threshold.parse(args.threshold_memory, "memory", allow_bytes=True))
    render_console.print_comparison(comparison, console)
    stem = args.output or Path("reports") / f"compare-{Path(args.candidate[0]).name}-vs-{Path(args.baseline[0]).name}"
    try:
        paths = write_outputs(comparison, Path(stem))
    except OSError as exc:
        raise UserError(f"{stem}: cannot write the comparison ({exc.strerror or exc})") from None
    console.print("wrote " + ", ".join(str(p) for p in paths.values()), highlight=False, soft_wrap=True)
    return comparison.exit_code


def cmd_export(args, console) -> int:
    from amp_bench.analysis import exports
    wanted = "a file" if args.format == "bmf" else "a folder"
    if args.output is not None and (args.output.is_dir() if args.format == "bmf" else args.output.is_file()):
        raise UserError(f"--output {args.output}: --format {args.format} writes {wanted} there, and it is "
                        f"{'a folder' if args.output.is_dir() else 'a file'}")
    if args.format == "bmf":
        text = exports.write_bmf(args.results, args.output, args.machine)
        if args.output is None:
            print(text, end="")  # plain: the JSON goes to a pipe untouched by rich
        else:
            console.print(f"bmf: {args.output}", highlight=False, soft_wrap=True)
        return 0
    written = exports.write_otava(args.results, args.output or Path("reports") / "otava", args.machine)
    console.print(f"otava: {written[0]} and {len(written) - 1} series CSV(s) in {written[0].parent}",
                  highlight=False, soft_wrap=True)
    return 0


def cmd_ingest(args, console) -> int:
    from amp_bench.store.ingest import ingest
    for path in args.files:
        run_dir = ingest(path, args.results_dir)
        console.print(f"{path} -> {run_dir}", highlight=False, soft_wrap=True)
    return 0
