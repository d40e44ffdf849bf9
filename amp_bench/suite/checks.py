"""Validator building blocks: the checks that fields.py composes into the suite's field tables.

A check takes (value, path, problems) and returns the normalised value, or None when the value is
invalid, after appending one line per problem ("path: expected ..., got ...") to `problems`. Every
problem is collected, so a file with five mistakes gets five lines in one go.
"""
from __future__ import annotations

import contextlib
import difflib
import re
from collections.abc import Callable
from typing import Any

Problems = list[str]


def type_name(value: Any) -> str:
    return type(value).__name__


def integer(lo: int, hi: int, what: str = "an integer") -> Callable:
    def check(value, path, problems):
        if isinstance(value, bool) or not isinstance(value, int):
            problems.append(f"{path}: expected {what} between {lo} and {hi}, got {value!r} ({type_name(value)})")
            return None
        if not lo <= value <= hi:
            problems.append(f"{path}: expected {what} between {lo} and {hi}, got {value}")
            return None
        return value
    return check


def number(lo_exclusive: float, hi: float) -> Callable:
    def check(value, path, problems):
        if isinstance(value, str):  # YAML 1.1 reads 1e-3 (no dot) as a string
            with contextlib.suppress(ValueError):
                value = float(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
            problems.append(f"{path}: expected a number, got {value!r} ({type_name(value)})")
            return None
        if not lo_exclusive < value <= hi:
            problems.append(f"{path}: expected a number > {lo_exclusive} and <= {hi}, got {value}")
            return None
        return float(value)
    return check


def matching(pattern: re.Pattern, expected: str, hint: str = "") -> Callable:
    """A string the whole of which `pattern` matches; else "expected <expected>, got <value><hint>"."""
    def check(value, path, problems):
        if not isinstance(value, str) or not pattern.fullmatch(value):
            problems.append(f"{path}: expected {expected}, got {value!r}{hint}")
            return None
        return value
    return check


def _accepting(accepts: Callable[[Any], bool], expected: str) -> Callable:
    """A value `accepts` takes; else "expected <expected>, got <value> (<its type>)"."""
    def check(value, path, problems):
        if not accepts(value):
            problems.append(f"{path}: expected {expected}, got {value!r} ({type_name(value)})")
            return None
        return value
    return check


boolean = _accepting(lambda value: isinstance(value, bool), "true or false")
text = _accepting(lambda value: isinstance(value, str) and bool(value.strip()), "a non-empty string")
mapping = _accepting(lambda value: isinstance(value, dict), "a mapping")


def choice(choices: tuple[str, ...]) -> Callable:
    def check(value, path, problems):
        if not isinstance(value, str) or value not in choices:
            hint = ""
            if isinstance(value, str):
                close = difflib.get_close_matches(value, choices, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
            problems.append(f"{path}: expected one of {', '.join(choices)}, got {value!r}{hint}")
            return None
        return value
    return check


def axis(item_check: Callable, what: str) -> Callable:
    """A matrix axis: a single value or a non-empty list of distinct values."""
    def check(value, path, problems):
        value = list(value) if isinstance(value, tuple) else value
        items = value if isinstance(value, list) else [value]
        if isinstance(value, list) and not value:
            problems.append(f"{path}: empty list: the matrix has no cases (expected at least one {what})")
            return None
        out, seen, ok = [], {}, True
        for i, item in enumerate(items):
            item_path = f"{path}[{i}]" if isinstance(value, list) else path
            checked = item_check(item, item_path, problems)
            if checked is None:
                ok = False
                continue
            if checked in seen:
                problems.append(f"{item_path}: duplicate case: {checked!r} is already listed at "
                                f"{path}[{seen[checked]}]")
                ok = False
                continue
            seen[checked] = i
            out.append(checked)
        return out if ok else None
    return check


def optional(check: Callable) -> Callable:
    """null keeps the default (e.g. threads_per_rank: null = cpu cores / processes)."""
    return lambda value, path, problems: None if value is None else check(value, path, problems)


def check_keys(data: dict, allowed, path: str, problems: Problems) -> None:
    for key in data:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), list(allowed), n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            problems.append(f"{join(path, str(key))}: unknown key ({hint}expected one of: {', '.join(allowed)})")


def join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def checked_fields(data: dict, path: str, problems: Problems, fields: dict[str, Callable]) -> dict:
    """Each present field through its check; the valid ones, normalised (problems collect the rest)."""
    out = {}
    for key, check in fields.items():
        if key in data:
            checked = check(data[key], join(path, key), problems)
            if checked is not None:
                out[key] = checked
    return out


def validate_section(value, path: str, problems: Problems, fields: dict[str, Callable]) -> dict | None:
    """A mapping whose keys are the field table's: unknown keys and bad values are problems."""
    if mapping(value, path, problems) is None:
        return None
    check_keys(value, fields, path, problems)
    return checked_fields(value, path, problems, fields)
