"""Command line: run, explain, predict, fidelity, headroom, status, report, compare, export, ingest, history, nightly,
validate, list-models, env.

This module builds the parser and dispatches; values.py checks every option's value as it is read;
each command group is a module holding its commands' options (add_parsers) and their cmd_* functions: run.py,
explain.py, predict.py, studies.py (fidelity, headroom), status.py, analysis.py (report, compare, export, ingest),
gate.py (history, nightly) and machine.py (validate, list-models, env). console.py draws every table and progress
display. The work itself is in the layers below (studies/, analysis/, store/, report/), imported inside the commands, so
`--help` and the analysis commands never import torch."""
from __future__ import annotations

import argparse
import os
import sys

from rich.console import Console
from rich.markup import escape

from amp_bench.cli import analysis, explain, gate, machine, predict, run, status, studies, values
from amp_bench.errors import UserError

# in the order `--help` lists their commands
COMMAND_GROUPS = (run, explain, predict, studies, status, analysis, gate, machine)


class Parser(argparse.ArgumentParser):
    """argparse, with a bad command line said in one line (its usage block left to --help), exit 2."""

    def error(self, message: str):
        self.exit(2, f"error: {self.prog}: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """Every command's parser; each option that takes a value checked where it is read (values.py)."""
    parser = Parser(prog="amp_bench", description="Measure what PyTorch AMP buys in training.")
    sub = parser.add_subparsers(dest="command", required=True)
    for group in COMMAND_GROUPS:
        group.add_parsers(sub)
    values.harden(sub)
    return parser


LOG_WIDTH = 1000  # when stdout is a file: wide enough that no table is cut; tables keep their natural width


def make_console(stderr: bool = False) -> Console:
    """A terminal keeps rich's look at the terminal's width. Output going to a file or a pipe (a CI
    log) is read later, whole: rich would cut tables at 80 columns there ("samples…"), so it gets
    room for every column. COLUMNS, when set, wins in both cases."""
    stream = sys.stderr if stderr else sys.stdout
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return Console(stderr=stderr, width=int(columns))
    return Console(stderr=stderr) if stream.isatty() else Console(stderr=stderr, width=LOG_WIDTH)


def dispatch(args, console) -> int:
    """Run the parsed command; a UserError becomes one red line per problem on stderr and its exit code."""
    try:
        return args.func(args, console)
    except UserError as exc:
        err = make_console(stderr=True)
        for line in exc.lines:
            err.print(f"[red]error[/]: {escape(line)}", highlight=False, soft_wrap=True)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # --help (0), or a bad command line already said in one line (2)
        return exc.code if isinstance(exc.code, int) else 2
    return dispatch(args, make_console())
