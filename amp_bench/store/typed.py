"""Tables read back typed, once, from the column declarations (store/columns.py): results, samples and
the study tables.

A column read back from CSV holds True/False, "True"/"False", 1/0, 1.0/0.0 or is empty, depending on
the pandas version and on whether the run had any value at all; an integer column with one empty
cell comes back float; a text column of digits ("12.10", a hex hash of digits only) comes back a
number. `typed` gives every declared column its kind: yes/no columns pandas' nullable boolean
(True, False, or NA: unknown; read as store/flags.py's `is_true` reads a cell), integer columns
nullable Int64, float columns float64, text columns text; rows written before a column existed get
its read default (compile_mode eager, world_size 1, channels_last False, ...). Torch-free.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from amp_bench.identity import TRUE_TEXT
from amp_bench.store.columns import BOOL, FLOAT, INT, READ_DEFAULTS, TABLE_KINDS, TEXT, read_as_float


def text_dtypes(table: str = "results") -> dict[str, type]:
    """read_csv's dtype for a table's text columns: their cells stay text ("12.10" is not 12.1)."""
    return {name: str for name, kind in TABLE_KINDS[table].items() if kind == TEXT}


def typed(frame: pd.DataFrame, columns: list[str] | None = None, table: str = "results") -> pd.DataFrame:
    """The frame with every column `table` declares (store/columns.py: results, samples, the study tables) in
    its kind and read default, and every name in `columns` (default: the table's) present, empty where no row
    had it. Other columns are kept as they are, in their order; missing ones are added after them. A frame
    without rows comes back as it is (the readers join it with empty frames of their own)."""
    if frame.empty:
        return frame
    kinds = TABLE_KINDS[table]
    defaults = READ_DEFAULTS if table == "results" else {}
    columns = list(kinds) if columns is None else columns
    names = list(frame.columns) + [c for c in columns if c not in frame.columns]
    out = {}
    for name in names:
        kind, values, default = kinds.get(name), frame.get(name), defaults.get(name)
        kind = FLOAT if read_as_float(name, kind) else kind
        if values is None or kind and values.dtype == np.float64 and values.isna().all():  # absent, or read empty:
            # what as_kind makes of it, without its ~1 ms a column (a table declares ~200)
            values = pd.Series(pd.NA if kind in (BOOL, INT) else np.nan, index=frame.index, dtype=_EMPTY[kind])
            out[name] = values if default is None else values.fillna(default)
        else:
            out[name] = values if kind is None else as_kind(values, kind, default)
    return pd.DataFrame({name: values.array for name, values in out.items()}, index=frame.index)


_EMPTY = {BOOL: "boolean", INT: "Int64", FLOAT: "float64", TEXT: object, None: object}


def as_kind(values: pd.Series, kind: str, default=None) -> pd.Series:
    converted = {BOOL: _as_bool, INT: _as_int, FLOAT: _as_float, TEXT: _as_text}[kind](values)
    return converted if default is None else converted.fillna(default)


def _blank(values: pd.Series) -> pd.Series:
    """Cells that hold nothing: NA, or text that is only whitespace."""
    return values.isna() | values.map(lambda v: isinstance(v, str) and not v.strip()).astype(bool)


def _as_bool(values: pd.Series) -> pd.Series:
    if isinstance(values.dtype, pd.BooleanDtype):
        return values
    if pd.api.types.is_bool_dtype(values.dtype):
        return values.astype("boolean")
    cells = values.astype(object)
    blank = _blank(cells)
    out = cells.where(~blank, "").map(lambda v: str(v).strip().lower()).isin(TRUE_TEXT).astype("boolean")
    out[blank.to_numpy()] = pd.NA
    return out


def _numbers(values: pd.Series) -> pd.Series | None:
    """The cells as numbers; None when a cell that holds something is not one (kept as read)."""
    if pd.api.types.is_numeric_dtype(values.dtype) and not pd.api.types.is_bool_dtype(values.dtype):
        return values
    numbers = pd.to_numeric(values.where(~_blank(values.astype(object)), np.nan), errors="coerce")
    return None if (numbers.isna() & ~_blank(values.astype(object))).any() else numbers


def _as_int(values: pd.Series) -> pd.Series:
    if isinstance(values.dtype, pd.Int64Dtype):
        return values
    numbers = _numbers(values)
    if numbers is None:
        return values
    present = numbers.dropna().astype(float)
    if not np.isfinite(present).all() or (present % 1 != 0).any():
        return numbers  # not whole numbers: kept as read, never rounded
    return numbers.astype("Int64")


def _as_float(values: pd.Series) -> pd.Series:
    if values.dtype == np.float64:
        return values
    numbers = _numbers(values)
    return values if numbers is None else numbers.astype("float64")


def _as_text(values: pd.Series) -> pd.Series:
    """Text cells as str, empty ones NA; a column that came back numeric (all empty, or digits) as
    text. The string dtype read_csv gives (pandas 3's str, pandas 2's object) is kept."""
    if pd.api.types.is_string_dtype(values.dtype) and values.dtype != object:
        return values
    cells = values.astype(object)
    blank = _blank(cells)
    if not blank.all() and not cells[~blank].map(lambda v: isinstance(v, str)).all():
        cells = cells.map(lambda v: v if isinstance(v, str) else str(v))
    return cells.where(~blank, np.nan)
