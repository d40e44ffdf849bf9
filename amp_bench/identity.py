"""A case's identity, in one place: the axes that make a case besides its precision (CASE_AXES), the
ids a suite's Case and its rows carry (`case_id`, `group_id`), the keys every reader groups on and the
one readable label. A new axis of the matrix is one entry in CASE_AXES; its words in an id and a label
go in ID_WORDS and LABEL_WORDS (an axis without them reads `axis-value` and `axis value`).

Part of the shared base (suite/ builds ids from here, store/, analysis/, report/ and gpu_check/ group
and name through it); pandas is imported only by the functions that take a frame.
"""
from __future__ import annotations

import re

TRUE_TEXT = frozenset({"true", "1", "1.0", "yes"})  # a yes in a cell, as pandas or a CSV left a bool
EAGER = "eager"  # the compile axis' value for "not compiled", and the read default of rows from before it
# what makes a case, besides its precision; the value a row written before the axis existed meant
CASE_AXES: dict[str, object] = {
    "model_label": None, "batch_size": None, "image_size": None, "seq_len": None, "channels_last": False,
    "nproc_per_node": None, "world_size": 1, "compile_mode": EAGER,
    "variant": "",  # an advice item a case tries (run --try): "" for the suite's own cases
}
# where a case ran: merged results keep runs (and so machines) apart
RUN_KEYS = ["run_id", "suite", "device", "device_name"]
_ABSENT = -1  # image_size / seq_len for a model without one, in keys (pandas' groupby and join drop NaN keys)
SIZES = ("image_size", "seq_len", "nproc_per_node")  # nproc_per_node -1: a plain process, no DDP


def case_axes() -> list[str]:
    return list(CASE_AXES)


def group_keys() -> list[str]:
    """One comparison group: the run and the case's axes (its precisions are compared within it)."""
    return RUN_KEYS + case_axes()


def case_keys() -> list[str]:
    """One case wherever it ran (a series across runs and machines): its axes and precision, and its id, which
    keeps rows apart that carry no axes (an ingested pytest-benchmark, a row from before an axis)."""
    return ["case_id", *case_axes(), "precision"]


# --------------------------------------------------------------------------- ids

def _nodes_by_processes(row) -> str:
    procs = _int(row.get("nproc_per_node"))
    nodes = max(1, int(float(row.get("world_size") or procs)) // int(procs)) if positive(procs) else 1
    return f"np{procs}" if nodes == 1 else f"{nodes}x{procs}"


# an axis' word in case_id and group_id ('' when it says nothing); the compile mode ends the id (compile_suffix)
ID_WORDS = {
    "model_label": lambda row: str(row.get("model_label")),
    "batch_size": lambda row: f"bs{_int(row.get('batch_size'))}",
    "image_size": lambda row: f"{_int(row.get('image_size'))}px" if positive(row.get("image_size")) else "",
    "seq_len": lambda row: f"seq{_int(row.get('seq_len'))}" if positive(row.get("seq_len")) else "",
    "channels_last": lambda row: "cl" if is_true(row.get("channels_last")) else "",
    # keeps DDP cases apart from plain ones (and np1 from np2); nodes x processes on several nodes
    "nproc_per_node": lambda row: _nodes_by_processes(row) if positive(row.get("nproc_per_node")) else "",
    "world_size": lambda row: "",  # in nproc_per_node's word
    "compile_mode": lambda row: "",  # compile_suffix, after the precision
    "variant": lambda row: f"try-{_slug(row.get('variant'))}" if text(row.get("variant")) else "",
}


def compile_suffix(compile_mode) -> str:
    """'' when eager, so eager case ids are what they were before compile existed."""
    if not _compiled(compile_mode):
        return ""
    return "-compiled" if compile_mode == "default" else f"-c-{compile_mode}"


def _base_id(row) -> str:
    words = [ID_WORDS[axis](row) if axis in ID_WORDS else _other(axis, row.get(axis), "-") for axis in CASE_AXES]
    return "-".join(w for w in words if w)


def group_id(row) -> str:
    """The case without its precision (a dict of its axes, a row or a Series): cases sharing it are compared
    (a compile mode is compared with itself; the summary pairs it with eager separately)."""
    return _base_id(row) + compile_suffix(row.get("compile_mode"))


def case_id(row, precision: str) -> str:
    return f"{_base_id(row)}-{precision}{compile_suffix(row.get('compile_mode'))}"


# --------------------------------------------------------------------------- keys on a frame

def keyed(frame):
    """A copy whose key columns can be grouped and joined on: every run key and axis present, the
    defaults of rows written before an axis existed, and a size a model does not have as -1."""
    import pandas as pd
    out = frame.copy()
    for column in RUN_KEYS:
        if column not in out:
            out[column] = None
    for axis, default in CASE_AXES.items():
        if axis not in out:
            out[axis] = default
        elif default is not None:
            out[axis] = out[axis].astype(object).where(out[axis].notna(), default).infer_objects()
    for size in SIZES:
        out[size] = out[size].where(out[size].notna(), _ABSENT).infer_objects()
    out["channels_last"] = pd.Series([is_true(v) for v in out["channels_last"]], index=out.index, dtype=bool)
    return out


def unkeyed(frame):
    """keyed()'s -1 sizes back to empty, for tables people read."""
    out = frame.copy()
    for size in SIZES:
        if size in out:
            out[size] = out[size].replace(_ABSENT, float("nan"))
    return out


# --------------------------------------------------------------------------- the label

def _processes(value, row) -> str:
    more = positive(value) and (float(value) > 1 or positive(row.get("nproc_per_node")))
    return f"{_int(value)} process{'es' if float(value) > 1 else ''}" if more else ""


# an axis' words in the label ('' when it says nothing)
LABEL_WORDS = {
    "model_label": lambda v, row: str(v),
    "batch_size": lambda v, row: f"bs {_int(v)}",
    "image_size": lambda v, row: f"{_int(v)}px" if positive(v) else "",
    "seq_len": lambda v, row: f"seq {_int(v)}" if positive(v) else "",
    "channels_last": lambda v, row: "channels_last" if is_true(v) else "",
    "nproc_per_node": lambda v, row: "DDP" if positive(v) else "",  # a plain process says nothing
    "world_size": _processes,
    "compile_mode": lambda v, row: ("compiled" if v == "default" else f"compiled ({v})") if _compiled(v) else "",
    "variant": lambda v, row: f"try {v}" if text(v) else "",
}


def case_label(row, model: bool = True, without: tuple[str, ...] = ()) -> str:
    """'resnet50 bs 8 224px channels_last compiled 2 processes': one case, read from a row (a Series or
    a dict) through the axes. model=False leaves the model out (a chart faceted by model); `without`
    leaves out other axes (a table whose columns are that axis)."""
    left_out = set(without) | (set() if model else {"model_label"})
    words = [LABEL_WORDS[axis](row.get(axis), row) if axis in LABEL_WORDS else _other(axis, row.get(axis), " ")
             for axis in CASE_AXES if axis not in left_out]
    return " ".join(w for w in words if w)


def case_labels(frame, model: bool = True, without: tuple[str, ...] = ()):
    import pandas as pd
    return pd.Series([case_label(row, model, without) for _, row in frame.iterrows()], index=frame.index, dtype=object)


# --------------------------------------------------------------------------- cells
# is_true, text and positive read one cell, for ids and labels here and, through store/flags.py, for every
# reader of results: one reader each

def _other(axis: str, value, sep: str) -> str:
    """An axis without words of its own: its name and value; nothing when empty."""
    return "" if value is None or value != value else f"{axis}{sep}{value}"


def text(value) -> str:
    """One text cell: "" where it is empty (a typed text column's blank is NaN)."""
    return value if isinstance(value, str) else ""


def _slug(value) -> str:
    """A text value as an id word: what is not a letter, digit, `_` or `.` becomes `-`."""
    return re.sub(r"[^A-Za-z0-9_.]+", "-", text(value)).strip("-")


def is_true(value) -> bool:
    """A yes/no cell (a bool, numpy's, or text a CSV left: TRUE_TEXT); empty, NaN or None is no."""
    return str(value).strip().lower() in TRUE_TEXT


def _compiled(value) -> bool:
    return isinstance(value, str) and value not in (EAGER, "")


def positive(value) -> float | None:
    """One figure that is known: a number above 0; None for NaN, 0, empty or not a number."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if number == number and number > 0 else None


def _int(value) -> str:
    try:
        return str(int(float(value)))
    except (TypeError, ValueError):
        return str(value)
