"""What each command-line option's value may be, checked where argparse reads it: before a command
runs, so a bad value is one line naming the option (exit 2) and never reaches a worker.

Why one table here rather than a `type=` at each option: the options are declared in each command's
module, and the same option (--device, --results-dir, -o) must mean the same everywhere; `harden` gives
every value-taking option of every command its check from OPTION_TYPES (by option, or by command and
option where one name means two things), and tests/test_cli_values.py holds every option to having one.
An option that sets a suite field (suite/options.py) gets `declared`, the field's own check, and any other
number a check of suite/checks.py (`checked`), so the command line and a suite file agree on every limit. An
empty value is always an error, never the default. Other imports stay inside the checks: `--help` imports no more.
"""
from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from pathlib import Path

from amp_bench.suite import checks


def _fail(message: str):
    raise argparse.ArgumentTypeError(message)


def text(value: str) -> str:
    """Any non-empty one-line value (a name, a glob, a SLURM account)."""
    if not value.strip():
        _fail("expected a value, got an empty one")
    if any(c in value for c in "\n\r\0"):
        _fail(f"expected one line, got {value!r}")
    return value


def checked(convert: Callable, make_check: Callable[[], Callable], as_item: bool = False) -> Callable:
    """A value converted to its field's type (int, float or str) and held to a check of suite/checks.py, made
    when a value is read, so the command line and a suite file say every limit alike; `as_item`: the check is
    a list's (a repeatable option), and the value one item of it."""
    def parse(value: str):
        try:
            converted = convert(text(value).strip())
        except ValueError:
            _fail(f"expected {convert.__name__}, got {value!r}")
        problems: list[str] = []
        make_check()([converted] if as_item else converted, "", problems)
        if problems:
            _fail(re.sub(r"^(\[\d+\])?: ", "", problems[0]))
        return converted  # as given: the run checks it again, as it checks a suite's
    return parse


def declared(option) -> Callable:
    """The value of an option that sets a suite field (suite/options.py), checked by that field's own check."""
    return checked(option.convert, option.check, option.given == "values")


def device(value: str) -> str:
    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", text(value)):
        _fail(f"device {value!r}: expected cuda or cuda:N" if value.startswith("cuda") else
              f"expected auto, cpu, cuda or cuda:N, got {value!r}")
    return value


def mode_pair(value: str) -> tuple[str, str]:
    """BASE,MODE: two precision modes."""
    from amp_bench import modes
    pair = tuple(m.strip() for m in text(value).split(","))
    if len(pair) != 2 or any(m not in modes.names() for m in pair):
        _fail(f"expected BASE,MODE from {', '.join(modes.names())}, got {value!r}")
    return pair


def gpu_keys(value: str) -> tuple[str, ...]:
    """A comma-separated list of the spec table's GPU keys (predict --list-targets)."""
    from amp_bench.platform.gpu_specs import by_key
    keys = [k.strip() for k in text(value).split(",")]
    known = by_key()
    for key in keys:
        if key not in known:
            _fail(f"unknown GPU {key!r} (known: {', '.join(known)})" if key else f"an empty GPU key in {value!r}")
    return tuple(dict.fromkeys(keys))


def gpu(value: str) -> str:
    """One GPU of the spec table, by key, label or torch device name."""
    from amp_bench.platform.gpu_specs import by_key, find
    if find(text(value)) is None:
        _fail(f"{value!r} is not in the spec table (known keys: {', '.join(by_key())})")
    return value


def cpu_flags(value: str) -> str:
    """CPU flags the ceiling knows (analysis/explain/ceiling.py's CPU units), comma-separated."""
    from amp_bench.analysis.explain.ceiling import CPU_UNITS
    known = [flag for flag, _, _, _ in CPU_UNITS]
    for flag in text(value).split(","):
        if flag.strip() not in known:
            _fail(f"unknown CPU flag {flag.strip()!r} (the ceiling knows {', '.join(known)}; leave it out for none)")
    return value


def formats(known: tuple[str, ...]) -> Callable[[str], tuple[str, ...]]:
    def parse(value: str) -> tuple[str, ...]:
        items = tuple(f.strip() for f in text(value).split(","))
        if not items or any(f not in known for f in items):
            _fail(f"expected a comma-separated list of {', '.join(known)}, got {value!r}")
        return items
    return parse


def threshold(what: str, allow_bytes: bool = False) -> Callable[[str], str]:
    """A regression threshold (3%, or bytes such as 64MiB where allowed), checked by compare's own parser."""
    def parse(value: str) -> str:
        from amp_bench.analysis.compare import Threshold
        from amp_bench.errors import UserError
        try:
            Threshold.parse(text(value), what, allow_bytes=allow_bytes)
        except UserError as exc:
            _fail(exc.lines[0].split(": ", 1)[-1])
        return value
    return parse


def existing_file(value: str) -> Path:
    path = Path(text(value))
    if path.is_dir():
        _fail(f"{value}: a directory, not a file")
    if not path.is_file():
        _fail(f"{value}: no such file")
    return path


def suite_file(value: str) -> Path:
    """A suite file, said as the suite loader says it."""
    if not Path(text(value)).exists():
        _fail(f"{value}: suite file not found")
    return existing_file(value)


def existing_dir(value: str) -> Path:
    path = Path(text(value))
    if not path.is_dir():
        _fail(f"{value}: {'a file, not a directory' if path.exists() else 'no such directory'}")
    return path


def suite_or_run(value: str) -> Path:
    """A suite file or a run directory (predict's source)."""
    if Path(text(value)).is_dir():
        return Path(text(value))
    if not Path(text(value)).exists():
        _fail(f"{value}: no such suite file or run directory")
    return existing_file(value)


def output_dir(value: str) -> Path:
    path = Path(text(value))
    if path.exists() and not path.is_dir():
        _fail(f"{value}: a file, not a directory")
    return path


def output_file(value: str) -> Path:
    path = Path(text(value))
    if path.is_dir():
        _fail(f"{value}: a directory, not a file")
    if path.parent.exists() and not path.parent.is_dir():
        _fail(f"{path.parent}: a file, not a directory")
    return path


def output_stem(value: str) -> Path:
    """A path stem the command adds .md, .json, ... to."""
    path = output_file(value)
    if not path.name.strip("."):
        _fail(f"{value}: expected a path stem such as reports/compare")
    return path


def option_types() -> dict[str, Callable]:
    """Option -> its check, for every command that has the option."""
    return {
        "--device": device, "--results-dir": output_dir, "--reports-dir": output_dir, "--resume": existing_dir,
        "--try": text, "--trace": existing_file, "--modes": mode_pair, "--cpu-isa": cpu_flags,
        "--target": gpu_keys, "--source-gpu": gpu, "--csv": output_file,
        "--prices": existing_file, "--annotations": existing_file, "--dashboard": output_file,
        "--reference": text, "--machine": text, "--suite": text, "--note": text, "--history": text,
        "--threshold-time": threshold("time"), "--threshold-throughput": threshold("throughput"),
        "--threshold-speedup": threshold("speedup"), "--threshold-memory": threshold("memory", allow_bytes=True),
        "--max-age": checked(float, lambda: checks.number(0, 3650)),
    }


SEED = checked(int, lambda: checks.integer(0, 2**32 - 1, "a seed"))
# (command, option or positional): where a name means something else in one command
COMMAND_TYPES: dict[tuple[str, str], Callable] = {
    **{(command, "suite"): suite_file for command in ("run", "explain", "fidelity", "headroom")},
    ("validate", "suites"): suite_file,
    ("predict", "run_dir"): suite_or_run, ("nightly", "results"): existing_dir,
    ("ingest", "files"): existing_file,
    **{(command, "results"): text for command in ("status", "report", "export", "history")},
    ("compare", "baseline"): text, ("compare", "candidate"): text,
    ("report", "--output"): output_file, ("export", "--output"): lambda value: Path(text(value)),
    **{(command, "--output"): output_stem for command in ("compare", "history", "nightly")},
    ("report", "--format"): formats(("html", "md", "csv")), ("compare", "--seed"): SEED,
    **{(command, "--target"): lambda value: () if value == "none" else gpu_keys(value)  # none: no predictions
       for command in ("run", "explain")},
    **{(command, "--threshold-memory"): threshold("memory") for command in ("history", "nightly")},  # no byte form
}


def takes_value(action: argparse.Action) -> bool:
    return action.nargs != 0 and not isinstance(action, argparse._HelpAction)


def harden(subparsers: argparse._SubParsersAction) -> None:
    """Give every value-taking option and positional of every command its check (argparse's own
    `choices` stay as they are: they refuse an unknown or empty value already)."""
    from amp_bench.suite.options import OPTIONS
    table = option_types()
    by_command = {**COMMAND_TYPES, **{(c, o.flag): declared(o) for o in OPTIONS for c in o.commands}}
    for command, parser in subparsers.choices.items():
        for action in parser._actions:
            if not takes_value(action) or action.choices is not None:
                continue
            names = action.option_strings or [action.dest]
            check = next((by_command[(command, n)] for n in names if (command, n) in by_command), None)
            check = check or next((table[n] for n in names if n in table), None)
            if check is not None:
                action.type = check
