"""The cache of op inventories: one training step of a GPU case recorded on fake tensors
(measure/fake_step.py) as the Chrome trace predict reads, and the memory it held, kept by what decides
them; torch-free (the worker writes the files where the spec it gets names them: measure/fake_step.save).

What decides an inventory: the model (its reference, config, options, task, attention, padding), image
size, sequence length, batch, layout, the mode's autocast dtype and scaler (fp32 and tf32 run the same ops:
one inventory), fp8's recipe and filter, the optimizer (name and implementation), the recorder's format
and torch's version (its decompositions and autocast lists change what is recorded). A change to any of
them is another file; nothing is ever updated in place.

Where: $AMP_BENCH_CACHE/inventories, else $XDG_CACHE_HOME/amp_bench/inventories, else
~/.cache/amp_bench/inventories. A file that cannot be read back is recorded again.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from amp_bench import modes

FORMAT = 1  # what the recorder writes: a new format is a new key
ENV_VAR = "AMP_BENCH_CACHE"


def cache_dir() -> Path:
    base = os.environ.get(ENV_VAR) or str(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
                                          / "amp_bench")
    return Path(base) / "inventories"


def torch_version() -> str:
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return ""


def recorded_precision(precision: str) -> str:
    """The mode whose step is recorded for `precision`: tf32 runs fp32's ops (only the math differs)."""
    mode = modes.get(precision)
    return modes.reference() if not mode.uses_autocast and not mode.float8_linear else precision


def key(case: dict) -> str:
    """The cache key of a case (Case.to_json()): a digest of what decides its recorded step."""
    model = {k: v for k, v in (case.get("model") or {}).items() if k not in ("label", "precisions", "compile")}
    decided = {"model": model, "image_size": case.get("image_size"), "seq_len": case.get("seq_len"),
               "batch_size": case.get("batch_size"), "channels_last": bool(case.get("channels_last")),
               "precision": recorded_precision(case["precision"]), "optimizer": {
                   k: (case.get("optimizer") or {}).get(k) for k in ("name", "impl")},
               "fp8": [case.get("fp8_recipe"), case.get("fp8_skip_first_last")] if modes.get(
                   case["precision"]).float8_linear else None, "format": FORMAT, "torch": torch_version()}
    return hashlib.sha256(json.dumps(decided, sort_keys=True, default=str).encode()).hexdigest()[:20]


@dataclass(frozen=True)
class Entry:
    """One cached inventory: its trace and its memory record."""
    trace: Path
    memory: Path

    def complete(self) -> bool:
        return self.trace.is_file() and self.memory.is_file()

    def read_memory(self) -> dict:
        return json.loads(self.memory.read_text(encoding="utf-8"))


def entry(case: dict) -> Entry:
    name = key(case)
    return Entry(cache_dir() / f"{name}.json.gz", cache_dir() / f"{name}.memory.json")
