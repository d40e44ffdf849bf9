"""docs/timings.md's measured tables. benchmarks/main_job.py and benchmarks/time_tests.py each keep one
table there (a row per machine and setting); with --write they put their latest run in its row,
leaving the other machines' rows and the page's prose as they are."""
from __future__ import annotations

import os
from pathlib import Path

PAGE = Path(__file__).resolve().parent.parent / "docs" / "timings.md"


def machine() -> str:
    """This machine as the tables name it: CPU model, cores and the bf16/fp16 instructions it has."""
    from amp_bench.platform.device import read_cpu_info  # torch-free; the scripts put the repository on sys.path
    model, flags = read_cpu_info()
    isa = [f for f in ("avx512_bf16", "amx_bf16", "avx512_fp16", "amx_fp16") if f in flags]
    return f"{model}, {os.cpu_count()} cores, {'+'.join(isa) or 'no bf16 instructions'}"


def _markers(section: str) -> tuple[str, str]:
    return (f"<!-- {section}: rows rewritten by benchmarks/ (--write) -->", f"<!-- {section}: end -->")


def empty_section(section: str, header: list[str]) -> str:
    begin, end = _markers(section)
    return "\n".join([begin, "| " + " | ".join(header) + " |", "|" + "---|" * len(header), end])


def _split(text: str, section: str) -> tuple[str, list[str], str]:
    begin, end = _markers(section)
    start, stop = text.find(begin), text.find(end)
    if start < 0 or stop < start:
        raise ValueError(f"{PAGE.name} has no {section} table ({begin})")
    body = text[start + len(begin):stop].strip("\n").splitlines()
    return text[:start + len(begin)], body, text[stop:]


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def rows(text: str, section: str) -> list[dict[str, str]]:
    _, body, _ = _split(text, section)
    header = _cells(body[0])
    return [dict(zip(header, _cells(line), strict=False)) for line in body[2:] if line.strip()]


def update(text: str, section: str, row: dict[str, str], keys: tuple[str, ...]) -> str:
    """The page with `row` in the section's table: in place of the row with the same `keys`, else last."""
    head, body, tail = _split(text, section)
    header = _cells(body[0])
    table = rows(text, section)
    same = [i for i, old in enumerate(table) if all(old.get(k) == row.get(k) for k in keys)]
    if same:
        table[same[0]] = row
    else:
        table.append(row)
    lines = body[:2] + ["| " + " | ".join(str(r.get(h, "")).replace("|", "/") for h in header) + " |" for r in table]
    return head + "\n" + "\n".join(lines) + "\n" + tail


def write_row(section: str, row: dict[str, str], keys: tuple[str, ...], page: Path = PAGE) -> None:
    page.write_text(update(page.read_text(encoding="utf-8"), section, row, keys), encoding="utf-8")
    print(f"{page}: {section} row for {', '.join(row[k] for k in keys)} rewritten")
