"""Reading the typed columns of results: yes/no columns (`contended`, `emulated`, `compile_settled`,
...) and text columns (`reason`, `contention`, `warnings`): one reader each.

A column read back from CSV holds True/False, "True"/"False", 1/0, 1.0/0.0 or is empty, depending
on the pandas version and on whether the run had any value at all. Empty is never true: a figure is
only called emulated or contended where the row says so."""
from __future__ import annotations

import pandas as pd

# one cell's readers live in the base, which ids and labels read with too: store's readers ask them here
from amp_bench.identity import is_true, positive, text  # noqa: F401 - positive and text are re-exported


def true_rows(column: pd.Series | None, index=None) -> pd.Series:
    """A whole column as booleans; a missing column (None) is all False over `index`."""
    if column is None:
        return pd.Series(False, index=index, dtype=bool)
    return column if column.dtype == bool else column.map(is_true).astype(bool)


def text_column(table: pd.DataFrame, column: str) -> pd.Series:
    """A text column ("" where absent or empty). A column that came back from CSV all empty is float
    NaN: filling it with "" in place is a dtype change pandas refuses from its next major release."""
    if column not in table:
        return pd.Series("", index=table.index, dtype=object)
    values = table[column].astype(object)
    return values.where(values.notna(), "").astype(str)


def peak_memory(row, device_type: str | None = None):
    """A row's peak memory: the allocator's peak on a GPU, the worker's peak RSS elsewhere (the
    device is the row's own unless given)."""
    cuda = (device_type or row.get("device")) == "cuda"
    return row.get("peak_mem_allocated_bytes") if cuda else row.get("peak_rss_bytes")
