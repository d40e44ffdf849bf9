"""A case's identity as results rows carry it, and its one readable label: the single list of what
makes two rows the same case (besides precision), and the one way a case is named in a table, a
sentence or a chart. Every reader groups and names through here, so a new axis of the matrix is one
entry in CASE_AXES (the suite's Case builds its group_id from the same axes: suite/schema.py).

Torch-free; read by analysis/ and report/.
"""
from __future__ import annotations

import math

import pandas as pd

from amp_bench.store.columns import EAGER  # the compile_mode of an eager case (suite.schema's: one word)
from amp_bench.store.flags import is_true

# what makes a case, besides its precision; the value a row written before the axis existed meant
CASE_AXES: dict[str, object] = {
    "model_label": None, "batch_size": None, "image_size": None, "seq_len": None, "channels_last": False,
    "nproc_per_node": None, "world_size": 1, "compile_mode": EAGER,
}
# where a case ran: merged results keep runs (and so machines) apart
RUN_KEYS = ["run_id", "suite", "device", "device_name"]
_ABSENT = -1  # image_size / seq_len for a model without one, in keys (pandas' groupby and join drop NaN keys)


def case_axes() -> list[str]:
    return list(CASE_AXES)


def group_keys() -> list[str]:
    """One comparison group: the run and the case's axes (its precisions are compared within it)."""
    return RUN_KEYS + case_axes()


def keyed(frame: pd.DataFrame) -> pd.DataFrame:
    """A copy whose key columns can be grouped and joined on: every run key and axis present, the
    defaults of rows written before an axis existed, and a size a model does not have as -1."""
    out = frame.copy()
    for column in RUN_KEYS:
        if column not in out:
            out[column] = None
    for axis, default in CASE_AXES.items():
        if axis not in out:
            out[axis] = default
        elif default is not None:
            out[axis] = out[axis].astype(object).where(out[axis].notna(), default)
    for size in ("image_size", "seq_len", "nproc_per_node"):  # nproc_per_node -1: a plain process, no DDP
        out[size] = pd.to_numeric(out[size], errors="coerce").fillna(_ABSENT)
    out["channels_last"] = out["channels_last"].map(is_true).astype(bool)
    out["world_size"] = pd.to_numeric(out["world_size"], errors="coerce").fillna(1)
    return out


def unkeyed(frame: pd.DataFrame) -> pd.DataFrame:
    """keyed()'s -1 sizes back to empty, for tables people read."""
    out = frame.copy()
    for size in ("image_size", "seq_len", "nproc_per_node"):
        if size in out:
            out[size] = out[size].replace(_ABSENT, float("nan"))
    return out


def case_label(row, model: bool = True) -> str:
    """'resnet50 bs 8 224px channels_last compiled 2 processes': one case, read from a row (a Series or
    a dict) through the axes; an axis added to CASE_AXES without a wording here reads 'axis value'.
    model=False leaves the model out (a chart faceted by model)."""
    get = row.get
    parts = [f"{get('model_label')} bs {_int(get('batch_size'))}" if model else f"bs {_int(get('batch_size'))}"]
    words = {"image_size": lambda v: f"{_int(v)}px" if _positive(v) else "",
             "seq_len": lambda v: f"seq {_int(v)}" if _positive(v) else "",
             "channels_last": lambda v: "channels_last" if is_true(v) else "",
             "nproc_per_node": lambda v: "DDP" if _positive(v) else "",  # a plain process says nothing
             "world_size": lambda v: f"{_int(v)} process{'es' if float(v) > 1 else ''}" if _positive(v) and (
                 float(v) > 1 or _positive(get("nproc_per_node"))) else "",
             "compile_mode": lambda v: "" if not isinstance(v, str) or v in (EAGER, "", "nan") else
             ("compiled" if v == "default" else f"compiled ({v})")}
    for axis in case_axes():
        if axis in ("model_label", "batch_size"):
            continue
        value = get(axis)
        if axis in words:
            parts.append(words[axis](value))
        elif value is not None and not (isinstance(value, float) and math.isnan(value)):
            parts.append(f"{axis} {value}")
    return " ".join(p for p in parts if p)


def case_labels(frame: pd.DataFrame, model: bool = True) -> pd.Series:
    return pd.Series([case_label(row, model) for _, row in frame.iterrows()], index=frame.index, dtype=object)


def _positive(value) -> bool:
    try:
        return float(value) > 0
    except (TypeError, ValueError):
        return False


def _int(value) -> str:
    try:
        return str(int(float(value)))
    except (TypeError, ValueError):
        return str(value)
