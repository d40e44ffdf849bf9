"""Errors the user can fix: printed as one line each, never as a traceback."""
from __future__ import annotations


class UserError(Exception):
    """Bad input (suite, path, option). `lines` are printed one per line; exit code 2."""

    exit_code = 2

    def __init__(self, lines: list[str] | str):
        self.lines = [lines] if isinstance(lines, str) else list(lines)
        super().__init__("\n".join(self.lines))


class SuiteError(UserError):
    """A suite file with one or more problems, each 'FILE: FIELD.PATH: what was expected'."""


def read_json(path, what: str, expected: type):
    """A JSON file a worker or a user wrote, as `expected` (dict or list); unreadable or of another shape,
    one line naming the file and what it should hold."""
    import json
    from pathlib import Path
    path = Path(path)
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: unreadable {what} ({exc.__class__.__name__})") from None
    if not isinstance(value, expected):
        raise UserError(f"{path}: expected a JSON {'object' if expected is dict else 'list'} of {what}")
    return value
