"""One results row: the union of the records its writers make (the case's identity and plan, what its worker
measured, how the worker's process ran and ended, the run's FLOPs and explain verdict, the machine), each column
written once, by the side that knows it (put refuses a second writer), and checked against its declaration
(store/columns.py: declared, of its kind) as RunStore.add writes it. Read like a dict. Torch-free."""
from __future__ import annotations

from collections.abc import Iterator, Mapping

import numpy as np
import pandas as pd

from amp_bench.errors import UserError
from amp_bench.store.columns import BOOL, BY_NAME, FLOAT, INT, TEXT

WARNINGS = "warnings"  # the one column several writers add to (Row.warn): one cell of what each noticed
_BOOLS, _INTS = (bool, np.bool_), (int, np.integer)  # a count read back as float (read_as_float) is a whole one
_FITS = {BOOL: lambda v: isinstance(v, _BOOLS), TEXT: lambda v: isinstance(v, str),
         INT: lambda v: not isinstance(v, _BOOLS) and (isinstance(v, _INTS) or isinstance(v, float) and v.is_integer()),
         FLOAT: lambda v: isinstance(v, (*_INTS, float, np.floating)) and not isinstance(v, _BOOLS)}


class RowError(UserError):
    """A column the declaration does not have, of another kind, or written by two writers: the column named."""


class Row(Mapping):
    """A results row under construction: `put(by, columns)` adds one writer's record, `warn` a warning; `check()`,
    as the store writes it, holds every cell to its declaration."""

    def __init__(self, by: str = "", columns: Mapping | None = None):
        self._cells: dict = {}
        self._writers: dict[str, str] = {}
        self.held: dict = {}  # a writer's columns another judges before they are put (a worker's explain capture)
        if columns:
            self.put(by, columns)

    def put(self, by: str, columns: Mapping) -> Row:
        """`by`'s columns (a writer's words: "the worker", "the launcher"); RowError, and nothing put, when one
        is already written."""
        twice = [name for name in columns if name in self._writers]
        if twice:
            raise RowError(f"{twice[0]}: written twice, by {self._writers[twice[0]]} and by {by}")
        self._cells.update(columns)
        self._writers.update(dict.fromkeys(columns, by))
        return self

    def check(self) -> Row:
        """RowError naming the first cell the declarations lack, or not of its declared kind, and its writer."""
        for name, value in self._cells.items():
            column, by = BY_NAME.get(name), self._writers[name]
            if column is None:
                raise RowError(f"{name}: not a declared results column (store/columns.py), written by {by}")
            empty = value is None or value is pd.NA or (isinstance(value, float) and value != value)
            if not empty and not _FITS[column.kind](value):
                raise RowError(f"{name}: {type(value).__name__} {value!r} where {column.kind} is declared, "
                               f"written by {by}")
        return self

    def warn(self, text: str) -> Row:
        """A warning after those put (the worker's): `warnings` holds them all, in the order they came."""
        said = self._cells.get(WARNINGS)
        self._cells[WARNINGS] = " | ".join(w for w in (said, text) if isinstance(w, str) and w)
        self._writers.setdefault(WARNINGS, "a warning")
        return self

    def __getitem__(self, name: str):
        return self._cells[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._cells)

    def __len__(self) -> int:
        return len(self._cells)
