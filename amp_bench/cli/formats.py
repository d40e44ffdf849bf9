"""Numbers as the command line prints them (cli/console.py's tables, cli/progress.py's lines)."""
from __future__ import annotations


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


def _fmt(value, spec: str, suffix: str = "") -> str:
    try:
        return "-" if value is None or value != value else f"{value:{spec}}{suffix}"
    except (TypeError, ValueError):
        return "-"
