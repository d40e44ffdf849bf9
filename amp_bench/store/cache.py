"""A columnar cache of the results tables of a results tree, for history and nightly at fleet size.

The CSVs stay the source of truth: the cache (`.amp_bench_cache/results.pkl` at the tree root) holds
the columns history needs from every run directory's results.csv, keyed by the file's path, mtime
and size. A run directory that changed, appeared or vanished is re-read or dropped; the rest come
from the cache. A tree that cannot be written is read without caching.
"""
from __future__ import annotations

import contextlib
import glob
import os
import pickle
from pathlib import Path

import pandas as pd

from amp_bench import identity
from amp_bench.errors import UserError
from amp_bench.store.results import PARTS_DIR, RESULTS_FILE, RUN_SUBDIRS, catch_up
from amp_bench.store.typed import text_dtypes, typed

CACHE_DIR = ".amp_bench_cache"
CACHE_FILE = "results.pkl"
VERSION = 4  # 2: contended, contention; 3: typed (store/typed.py), text columns read as text; 4: the case's axes
COLUMNS = ["run_id", "suite", "status", "device", "device_name", "repeat", "hostname", "fingerprint", "timestamp",
           "step_time_ms_median", "throughput", "peak_mem_allocated_bytes", "peak_rss_bytes", "contended",
           "contention", *identity.case_keys()]  # a series is a case (its axes and precision)
_TEXT = {name: kind for name, kind in text_dtypes().items() if name in COLUMNS}  # read as text, not numbers


def _results_files(root: Path) -> dict[str, os.stat_result]:
    found = {}
    for dirpath, dirnames, _ in os.walk(root):
        if PARTS_DIR in dirnames:
            catch_up(Path(dirpath))  # rows a killed writer saved but did not table yet
        dirnames[:] = [d for d in dirnames if d != CACHE_DIR and d not in RUN_SUBDIRS]
        path = os.path.join(dirpath, RESULTS_FILE)
        if os.path.isfile(path):
            found[os.path.relpath(path, root)] = os.stat(path)
    return found


def _read(path: Path) -> pd.DataFrame:
    try:
        frame = pd.read_csv(path, usecols=lambda c: c in COLUMNS, dtype=_TEXT)
    except (ValueError, pd.errors.ParserError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: unreadable results table ({exc})") from None
    return frame.reindex(columns=COLUMNS)


def load_tree(root: str | os.PathLike, use_cache: bool = True) -> pd.DataFrame:
    """Result rows (COLUMNS only, typed: store/typed.py) of every run directory under root."""
    root = Path(root)
    if not root.exists():
        raise UserError(f"{root}: no such results directory")
    files = _results_files(root)
    if not files:
        raise UserError(f"{root}: no results.csv found (expected a run directory or a tree of them)")
    key = {rel: (st.st_mtime_ns, st.st_size) for rel, st in files.items()}
    cache_path = root / CACHE_DIR / CACHE_FILE
    cached: dict = {}
    if use_cache and cache_path.is_file():
        try:
            with open(cache_path, "rb") as fh:
                cached = pickle.load(fh)
            if cached.get("version") != VERSION:
                cached = {}
        except Exception:  # a broken cache is rebuilt, never trusted
            cached = {}
    index: dict = cached.get("index", {})
    frame: pd.DataFrame = cached.get("frame", pd.DataFrame(columns=[*COLUMNS, "_src"]))
    keep = [rel for rel in key if index.get(rel, (None,))[0] == key[rel]]
    if len(keep) == len(key) == len(index):
        return typed(frame.drop(columns="_src"), COLUMNS)  # typed already: each column's quick path
    parts = [frame[frame["_src"].isin(keep)]] if keep else []
    fresh = [_read(root / rel).assign(_src=rel) for rel in sorted(set(key) - set(keep))]
    fresh = [p for p in fresh if not p.empty]
    if fresh:  # typed once, together; the cache keeps typed rows, so a warm read is typed already
        parts.append(typed(pd.concat(fresh, ignore_index=True), COLUMNS))
    parts = [p for p in parts if not p.empty]
    frame = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=[*COLUMNS, "_src"])
    frame["_src"] = frame["_src"].astype("category")
    if use_cache:
        _write(cache_path, {"version": VERSION, "index": {rel: (key[rel],) for rel in key}, "frame": frame})
    return typed(frame.drop(columns="_src"), COLUMNS)


def _write(path: Path, payload: dict) -> None:
    with contextlib.suppress(OSError):  # read-only tree: work without a cache
        path.parent.mkdir(exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
        with open(tmp, "wb") as fh:
            pickle.dump(payload, fh, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, path)


def load_cached(inputs: list[str | os.PathLike], use_cache: bool = True) -> pd.DataFrame:
    """The columns history needs (COLUMNS, typed: store/typed.py) from run directories, trees of them
    (cached) or globs. amp_bench.store.results.load_results is the full reader; this is its fleet-size
    subset."""
    frames = []
    for item in inputs:
        text = str(item)
        paths = [Path(p) for p in sorted(glob.glob(text))] if glob.has_magic(text) else [Path(text)]
        if not paths:
            raise UserError(f"{text}: no path matches this pattern")
        for path in paths:
            catch_up(path)
            frames.append(_read(path / RESULTS_FILE) if (path / RESULTS_FILE).is_file() else load_tree(path, use_cache))
    frames = [f for f in frames if not f.empty]
    if not frames:
        raise UserError(f"{', '.join(map(str, inputs))}: the results tables are empty (no finished case yet)")
    return typed(pd.concat(frames, ignore_index=True), COLUMNS).drop_duplicates(["run_id", "case_id", "repeat"])
