"""Command line: run, fidelity, headroom, report, compare, ingest, history, nightly, validate, list-models, env.

This module builds the parser and dispatches; each command group is a module holding its commands'
options (add_parsers) and their cmd_* functions: run.py, studies.py (fidelity, headroom), analysis.py
(report, compare, ingest), gate.py (history, nightly) and machine.py (validate, list-models, env). console.py draws
every table and progress display. The work itself is in the layers below (studies/, analysis/,
store/, report/), imported inside the commands, so `--help` and the analysis commands never import
torch."""
from __future__ import annotations

import argparse

from rich.console import Console
from rich.markup import escape

from amp_bench.cli import analysis, gate, machine, run, studies
from amp_bench.errors import UserError

# in the order `--help` lists their commands
COMMAND_GROUPS = (run, studies, analysis, gate, machine)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="amp_bench", description="Measure what PyTorch AMP buys in training.")
    sub = parser.add_subparsers(dest="command", required=True)
    for group in COMMAND_GROUPS:
        group.add_parsers(sub)
    return parser


def dispatch(args, console) -> int:
    """Run the parsed command; a UserError becomes one red line per problem on stderr and its exit code."""
    try:
        return args.func(args, console)
    except UserError as exc:
        err = Console(stderr=True)
        for line in exc.lines:
            err.print(f"[red]error[/]: {escape(line)}", highlight=False, soft_wrap=True)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return dispatch(args, Console())

