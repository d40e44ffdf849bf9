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
