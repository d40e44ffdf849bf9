"""Results store: results/<run-id>/ with a tidy table, per-step samples and a manifest.

Every write goes to a temporary file that is then renamed over the old one, after each case, so a
killed run keeps every finished case and no file is ever half-written. A row is saved as its part
first and the tables are rebuilt from the parts; readers catch up a run killed between the two.
"""
from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import glob
import json
import os
import re
import socket
import time
from pathlib import Path

import pandas as pd

from amp_bench.errors import UserError
from amp_bench.store.columns import (  # noqa: F401 (re-exported)
    EXPLAIN_COLUMNS,
    RESULT_COLUMNS,
    SAMPLE_COLUMNS,
    SLURM_COLUMNS,
    TABLE_KINDS,
    Row,
    order_columns,
)
from amp_bench.store.flags import text_column, true_rows
from amp_bench.store.typed import text_dtypes, typed

RESULTS_FILE = "results.csv"
SAMPLES_FILE = "samples.csv"
MANIFEST_FILE = "manifest.json"
PLAN_FILE = "plan.json"  # a benchmark run's cases in order (studies/run_plan.py): what jobs and resume run
PARTS_DIR = "parts"  # one JSON file per row and its samples; the tables are rebuilt from them
LOCK_FILE = ".lock"
# a run directory's own folders: never run directories themselves (walks skip them)
RUN_SUBDIRS = frozenset({"logs", "work", PARTS_DIR, "heartbeats", "traces", "compile-cache", "slurm"})
# The run directory's layout (asv's idea: a version in every file set, so a later layout can still be
# read, and an older reader says plainly that it cannot). 1: results/samples CSV + manifest.json (plan.json,
# parts/ and heartbeats/ were added beside them: a reader of version 1 reads the tables as before).
FORMAT_VERSION = 1

def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower() or "x"


def make_run_id(device_label: str, when: dt.datetime | None = None, host: str | None = None) -> str:
    when = when or utc_now()
    return f"{when:%Y%m%dT%H%M%SZ}-{_slug(host or socket.gethostname())}-{_slug(device_label)}"


def write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def write_reports(stem: Path, texts: dict[str, tuple[str, str]]) -> dict[str, Path]:
    """A verdict's files beside each other: {key: (suffix, text)} -> STEM.suffix; their paths by key.
    compare and nightly write their md/JSON/JUnit through this."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = {}
    for key, (suffix, text) in texts.items():
        paths[key] = stem.with_name(stem.name + suffix)
        paths[key].write_text(text, encoding="utf-8")
    return paths


def _json_default(value):
    """numpy scalars (a median from pandas) as Python numbers; anything else as text."""
    item = getattr(value, "item", None)
    return item() if callable(item) else str(value)


class RunStore:
    """One run directory. add() writes a row and its samples as one part file (parts/KEY.json), then
    rewrites the tables from every part, atomically, under the directory's lock: several writers (the
    SLURM jobs of one partition, on several nodes) add rows to one run without a parent, and a part
    written again (a resumed case) replaces the first. Rows are in the order of their keys.

    `flush_every_s` (0: every add) lets a long run rewrite its tables at most that often: each
    rewrite builds the whole table, so a 40-pair smoke run's 320 rows cost it ~25 s of a ~110 s run
    when every add rewrote them. A part is on disk the moment it is added either way; `flush()` at the
    run's end (studies/session.running) and any reader (catch_up) bring the tables up to date."""

    flush_every_s = 0.0

    def __init__(self, root: Path, run_id: str):
        root = Path(root)
        directory = root / run_id
        n = 1
        while directory.exists():  # two runs in the same second on the same host
            n += 1
            directory = root / f"{run_id}-{n}"
        self.run_id = directory.name
        self.dir = directory
        try:
            (self.dir / "logs").mkdir(parents=True)
            (self.dir / "work").mkdir()
            (self.dir / PARTS_DIR).mkdir()
        except OSError as exc:
            raise UserError(f"{root}: cannot create the results directory ({exc.strerror or exc})") from None
        self._init_state()

    @classmethod
    def reopen(cls, run_dir: str | os.PathLike) -> RunStore:
        """An existing run directory, to add rows to (a SLURM job, `run --resume`)."""
        store = cls.__new__(cls)
        store.dir = Path(run_dir)
        store.run_id = store.dir.name
        manifest = read_manifest(store.dir)
        if manifest is None:
            raise UserError(f"{store.dir}: not a run directory (no {MANIFEST_FILE})")
        store._init_state()
        store.manifest = manifest
        for sub in ("logs", "work", PARTS_DIR):
            (store.dir / sub).mkdir(exist_ok=True)
        store._load_parts()
        return store

    def work_path(self, stem: str, suffix: str = "") -> Path:
        """A worker's file in work/: its spec (.json), its result (.result.json), torchrun's log folders (no suffix)."""
        return self.dir / "work" / f"{stem}{suffix}"

    def _init_state(self) -> None:
        self.manifest: dict = {}
        self._parts: dict[str, tuple[tuple, dict]] = {}  # key -> ((mtime_ns, size), {"row", "samples"})
        self._next = 0
        self.saved = 0  # rows in the tables (every part on disk once flush() has run)
        self._flushed_at = None  # time.monotonic() of the last flush

    @contextlib.contextmanager
    def locked(self):
        """The run directory's lock (POSIX, so it holds across the nodes of a shared filesystem)."""
        with open(self.dir / LOCK_FILE, "a+") as fh:
            fcntl.lockf(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.lockf(fh, fcntl.LOCK_UN)

    def update_manifest(self, change) -> dict:
        """Apply change(manifest) to the manifest on disk, under the lock: writers of one run (the
        parent, its jobs) each add their fields without losing the others'."""
        with self.locked():
            manifest = read_manifest(self.dir) or dict(self.manifest)  # the disk's is the latest
            change(manifest)
            manifest.setdefault("format_version", FORMAT_VERSION)
            write_text_atomic(self.dir / MANIFEST_FILE, json.dumps(manifest, indent=2, default=str) + "\n")
        self.manifest = manifest
        return manifest

    def write_manifest(self, **fields) -> None:
        self.update_manifest(lambda manifest: manifest.update(fields))

    def write_plan(self, plan: dict) -> None:
        """What the run will measure (plan.json): the cases, in order, for the jobs and for resume."""
        write_text_atomic(self.dir / PLAN_FILE, json.dumps(plan, default=_json_default) + "\n")

    def read_plan(self) -> dict:
        path = self.dir / PLAN_FILE
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise UserError(f"{self.dir}: no {PLAN_FILE} (a run written before amp_bench recorded its plan, or "
                            "not a benchmark run): it cannot be resumed; run the suite again") from None
        except (OSError, ValueError) as exc:
            raise UserError(f"{path}: unreadable plan ({exc})") from None

    def add(self, row: Row | dict, samples: list[dict], key: str | None = None) -> None:
        """Save one row with its samples, checked against the declarations (Row.check). `key` names its part
        (and orders it); the same key again replaces the row (a case run again)."""
        row = (row if isinstance(row, Row) else Row(f"the writer of {self.run_id}'s row", row)).check()
        if key is None:
            key = f"{self._next:05d}"
            self._next += 1
        path = self.dir / PARTS_DIR / f"{key}.json"
        text = json.dumps({"row": dict(row), "samples": samples}, default=_json_default)
        write_text_atomic(path, text)
        stat = path.stat()  # kept as read back (what _load_parts compares), so rows is current without a flush
        self._parts[key] = ((stat.st_mtime_ns, stat.st_size), json.loads(text))
        if self._flushed_at is None or time.monotonic() - self._flushed_at >= self.flush_every_s:
            self.flush()

    def _load_parts(self) -> None:
        folder = self.dir / PARTS_DIR
        seen = set()
        for entry in sorted(os.scandir(folder), key=lambda e: e.name) if folder.is_dir() else []:
            if not entry.name.endswith(".json"):
                continue  # a writer's temporary file
            key, stat = entry.name[: -len(".json")], entry.stat()
            seen.add(key)
            stamp = (stat.st_mtime_ns, stat.st_size)
            if self._parts.get(key, (None,))[0] != stamp:
                try:
                    self._parts[key] = (stamp, json.loads(Path(entry.path).read_text(encoding="utf-8")))
                except ValueError as exc:
                    raise UserError(f"{entry.path}: unreadable result part ({exc})") from None
        self._parts = {key: part for key, part in self._parts.items() if key in seen}
        self._next = max(self._next, len(self._parts))

    def refresh(self) -> None:
        """What other writers of this run saved since: their rows, and the manifest."""
        self._load_parts()
        self.manifest = read_manifest(self.dir) or self.manifest

    @property
    def rows(self) -> list[dict]:
        return [self._parts[k][1]["row"] for k in sorted(self._parts)]

    @property
    def part_keys(self) -> list[str]:
        return sorted(self._parts)

    def write_table(self, name: str, rows: list[dict]) -> None:
        write_table(self.dir, name, rows)

    def flush(self) -> None:
        with self.locked():
            self._load_parts()
            parts = [self._parts[k][1] for k in sorted(self._parts)]
            table = order_columns(pd.DataFrame([p["row"] for p in parts]))
            samples = pd.DataFrame([s for p in parts for s in p["samples"]], columns=SAMPLE_COLUMNS)
            # samples first: a kill between the two renames leaves samples without a row, never a row
            # without its samples
            write_text_atomic(self.dir / SAMPLES_FILE, samples.to_csv(index=False))
            write_text_atomic(self.dir / RESULTS_FILE, table.to_csv(index=False))
        self.saved = len(parts)
        self._flushed_at = time.monotonic()


# ----------------------------------------------------------------------------- reading
# The one reader of run directories: report, compare, history, the studies' tables and the API all
# find and load runs through these functions.

def _paths(inputs):
    """(inputs as given, every existing path they name): paths, or glob patterns (a str or a list);
    a pattern that matches nothing, or a path that does not exist, is a one-line error."""
    inputs = [inputs] if isinstance(inputs, (str, os.PathLike)) else list(inputs)
    paths = []
    for item in inputs:
        text = str(item)
        matches = [Path(p) for p in sorted(glob.glob(text, recursive=True))] if glob.has_magic(text) else [Path(text)]
        if not matches:
            raise UserError(f"{text}: no path matches this pattern")
        for path in matches:
            if not path.exists():
                raise UserError(f"{path}: no such results directory")
            paths.append(path)
    return inputs, paths


def catch_up(run_dir: Path) -> None:
    """Rebuild a run's tables when its parts are newer: a writer killed between saving a part and
    rewriting the tables (RunStore.add) left the row on disk but not yet in results.csv. Adding a
    part renames it into parts/, which moves the folder's mtime, so one stat per run tells. A tree
    that cannot be written is read as it is."""
    run_dir = Path(run_dir)
    try:
        parts = (run_dir / PARTS_DIR).stat().st_mtime_ns
    except OSError:
        return  # no parts folder: a run written before parts existed, or not a run
    try:
        behind = parts > (run_dir / RESULTS_FILE).stat().st_mtime_ns
    except FileNotFoundError:
        behind = any(name.endswith(".json") for name in os.listdir(run_dir / PARTS_DIR))
    if behind and (run_dir / MANIFEST_FILE).is_file():
        with contextlib.suppress(OSError):
            RunStore.reopen(run_dir).flush()


def find_run_dirs(inputs) -> list[Path]:
    """Run directories (with a results table, or rows not yet in one) from paths to run dirs, trees
    of them, or globs; their tables caught up with their parts (catch_up)."""
    inputs, paths = _paths(inputs)
    found: list[Path] = []
    for path in paths:
        if (path / RESULTS_FILE).is_file() or (path / PARTS_DIR).is_dir():
            found.append(path)
        else:
            found.extend(sorted({p.parent for p in path.rglob(RESULTS_FILE)}
                                | {p.parent for p in path.rglob(PARTS_DIR) if (p.parent / MANIFEST_FILE).is_file()}))
    for run_dir in found:
        catch_up(run_dir)
    found = [d for d in found if (d / RESULTS_FILE).is_file()]
    return _unique(found, inputs, f"no {RESULTS_FILE} found (expected run directories written by `amp_bench "
                                  "run`, a tree of them, or a glob)")


def find_runs(inputs) -> list[Path]:
    """Run directories by their manifest (a run that has no row yet included), from paths, trees or globs."""
    inputs, paths = _paths(inputs)
    found: list[Path] = []
    for path in paths:
        if (path / MANIFEST_FILE).is_file():
            found.append(path)
            continue
        for dirpath, dirnames, filenames in os.walk(path):
            dirnames[:] = sorted(d for d in dirnames if d not in RUN_SUBDIRS and not d.startswith("."))
            if MANIFEST_FILE in filenames:
                found.append(Path(dirpath))
                dirnames[:] = []
    for run_dir in found:
        catch_up(run_dir)
    return _unique(found, inputs, f"no run directory found (no {MANIFEST_FILE})")


def _unique(found: list[Path], inputs: list, missing: str) -> list[Path]:
    """The run directories found, each once (resolved), in order; none is a one-line error."""
    unique = list(dict.fromkeys(p.resolve() for p in found))
    if not unique:
        raise UserError(f"{', '.join(map(str, inputs))}: {missing}")
    return unique


def dirs_with_table(folder: str | os.PathLike, name: str) -> list[Path]:
    """The run directories under `folder` that hold NAME.csv (a study's table: fidelity, headroom),
    none when the folder is absent: for callers that read what a stage may not have written."""
    folder = Path(folder)
    return sorted(p.parent for p in folder.rglob(f"{name}.csv")) if folder.is_dir() else []


def write_table(run_dir: Path, name: str, rows: list[dict]) -> None:
    """Another tidy table of a run (fidelity.csv, headroom.csv, advice.csv, predicted.csv, ...), rewritten
    atomically: the columns store/columns.py declares for it, in their order."""
    frame = pd.DataFrame(rows, columns=list(TABLE_KINDS[name]))
    write_text_atomic(Path(run_dir) / f"{name}.csv", frame.to_csv(index=False))


def read_table(run_dirs: list[Path], name: str, columns: list[str] | None = None,
               with_run_dir: bool = False) -> pd.DataFrame:
    """One table (NAME.csv) of every run directory that has it, concatenated; header-only files are
    left out (concatenating them would turn every column to object). Empty: a frame with `columns` (default:
    a declared table's own).
    with_run_dir adds a `run_dir` column (where each row came from). An unreadable file is a
    UserError naming it, never skipped. A declared table (results, samples, the study tables) with rows
    comes back typed (store/typed.py): every declared column in its kind, with its read default, present
    even where no run wrote it."""
    declared = name in TABLE_KINDS
    frames = []
    for run_dir in run_dirs:
        file = Path(run_dir) / f"{name}.csv"
        if file.is_file() and file.stat().st_size:
            try:
                frame = pd.read_csv(file, dtype=text_dtypes(name) if declared else None)
            except (ValueError, pd.errors.ParserError) as exc:
                raise UserError(f"{file}: unreadable results table ({exc})") from None
            if not frame.empty:  # copy(): one block per dtype, so the added column does not fragment it
                frames.append(frame.copy().assign(run_dir=str(run_dir)) if with_run_dir else frame)
    if not frames:  # untyped, as before the typed read: readers join it with their own empty frames
        return pd.DataFrame(columns=columns or list(TABLE_KINDS.get(name, [])))
    # one block per dtype: frames with different columns concatenate into one block per column,
    # and a caller adding a column to that would trip pandas' fragmentation warning
    table = pd.concat(frames, ignore_index=True).copy()
    return typed(table, table=name) if declared else table


def contended(table: pd.DataFrame) -> pd.Series:
    """Rows marked `contended` (the machine was busy with something else while they ran).
    Such a row is not comparable: history, nightly and compare leave it out. Results written before
    the column existed (or with it empty) are not contended."""
    return true_rows(table.get("contended"), table.index)


def contention_reason(table: pd.DataFrame) -> pd.Series:
    """The `contention` text of each row ("" where absent)."""
    return text_column(table, "contention")


def read_manifest(run_dir: Path) -> dict | None:
    """A run directory's manifest (None when it has none). Directories written before the format
    version existed are version 1; a newer layout than this reader knows is refused in one line."""
    path = Path(run_dir) / MANIFEST_FILE
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise UserError(f"{path}: unreadable manifest (invalid JSON)") from None
    if not isinstance(manifest, dict):
        raise UserError(f"{path}: unreadable manifest (expected a JSON object)")
    version = manifest.get("format_version", 1)
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise UserError(f"{path}: format_version {version!r} is newer than this amp_bench reads "
                        f"({FORMAT_VERSION}): upgrade amp_bench to read it")
    return manifest


def read_manifests(run_dirs: list[Path]) -> list[dict]:
    return [m for m in (read_manifest(d) for d in run_dirs) if m is not None]


def load_results(path: str | os.PathLike = "results") -> pd.DataFrame:
    """One row per case and repeat, from one run directory or a tree of them, typed (read_table)."""
    return _load(path, RESULTS_FILE, RESULT_COLUMNS)


def load_samples(path: str | os.PathLike = "results") -> pd.DataFrame:
    """Per-step samples (long format), from one run directory or a tree of them."""
    return _load(path, SAMPLES_FILE, SAMPLE_COLUMNS)


def _load(path, file_name: str, columns: list[str]) -> pd.DataFrame:
    table = read_table(find_run_dirs(path), file_name[: -len(".csv")], columns)
    if table.empty:
        raise UserError(f"{path}: no {file_name} found (expected a run directory or a tree of them)")
    return table
