"""Reading a suite file: the YAML, every field through the field tables, one line per problem.

load_suite returns a Suite whose settings have the defaults filled in (schema.DEFAULTS); it raises
SuiteError listing every problem found, including those only the expanded matrix shows, on every
device type. validate_overrides puts command-line / API overrides through the same checks.
"""
from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

import yaml

from amp_bench.errors import SuiteError
from amp_bench.suite.checks import Problems, _check_keys, _mapping, _str, _type_name
from amp_bench.suite.executor import validate_executor
from amp_bench.suite.fields import (
    DEVICE_BLOCKS,
    SECTIONS,
    SETTING_KEYS,
    TOP_ONLY,
    _validate_fidelity,
    _validate_headroom,
    _validate_predict,
    _validate_settings,
)
from amp_bench.suite.matrix import Suite
from amp_bench.suite.schema import DEFAULTS, OptimizerSpec


def _read(path: Path) -> tuple[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SuiteError(f"{path}: suite file not found") from None
    except IsADirectoryError:
        raise SuiteError(f"{path}: is a directory, expected a suite .yaml file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SuiteError(f"{path}: cannot read suite file ({exc})") from None
    try:
        return text, yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SuiteError(f"{path}{where}: invalid YAML: {problem}") from None


def load_suite(path: str | Path) -> Suite:
    """Read and validate a suite. Raises SuiteError listing every problem found."""
    path = Path(path)
    text, data = _read(path)
    problems: Problems = []
    if data is None:
        raise SuiteError(f"{path}: empty suite file (expected a mapping with at least 'models' and 'batch_sizes')")
    if not isinstance(data, dict):
        raise SuiteError(f"{path}: expected a mapping at the top level, got {_type_name(data)}")
    search_dirs = (str(path.resolve().parent),)
    _check_keys(data, SETTING_KEYS + TOP_ONLY + SECTIONS, "", problems)
    settings = {**DEFAULTS["settings"], "optimizer": OptimizerSpec(**DEFAULTS["settings"]["optimizer"])}
    settings.update(_validate_settings(data, "", problems, search_dirs))
    for required in ("models", "batch_sizes"):
        fidelity_only = "fidelity" in data or any(isinstance(data.get(b), dict) and "fidelity" in data[b]
                                                  for b in DEVICE_BLOCKS)
        if required not in data and not fidelity_only:  # a fidelity-only suite needs no matrix
            problems.append(f"{required}: missing (the matrix needs models and batch_sizes)")
    sections = {"fidelity": None, "headroom": None}
    sections["fidelity"] = _validate_fidelity(data["fidelity"], "fidelity", problems) if "fidelity" in data else None
    sections["headroom"] = _validate_headroom(data["headroom"], "headroom", problems) if "headroom" in data else None
    executor = validate_executor(data["executor"], "executor", problems) if "executor" in data else None
    predict = _validate_predict(data["predict"], "predict", problems) if "predict" in data else None
    top = DEFAULTS["suite"]
    name = _str(data.get("name", path.stem), "name", problems)  # the default name is derived: the file's stem
    description = data.get("description", top["description"])
    if not isinstance(description, str):
        problems.append(f"description: expected a string, got {_type_name(description)}")
    device = data.get("device", top["device"])
    if not (isinstance(device, str) and re.fullmatch(r"auto|cpu|cuda(:\d+)?", device)):
        problems.append(f"device: expected auto, cpu, cuda or cuda:N, got {device!r}")
    blocks = {}
    for block in DEVICE_BLOCKS:
        if block in data:
            if _mapping(data[block], block, problems) is None:
                continue
            _check_keys(data[block], SETTING_KEYS + SECTIONS, block, problems)
            blocks[block] = _validate_settings(data[block], block, problems, search_dirs)
            if "fidelity" in data[block]:
                blocks[block]["fidelity"] = _validate_fidelity(data[block]["fidelity"], f"{block}.fidelity", problems)
            if "headroom" in data[block]:
                blocks[block]["headroom"] = _validate_headroom(data[block]["headroom"], f"{block}.headroom", problems)
    if problems:
        raise SuiteError([f"{path}: {p}" for p in problems])
    suite = Suite(path=path, name=name, description=description, device=device,
                  sha256=hashlib.sha256(text.encode()).hexdigest(), text=text,
                  settings=settings, blocks=blocks, executor=executor or {}, predict=predict, **sections)
    for block in DEVICE_BLOCKS:  # every device's matrix must be sound, not just this machine's
        if suite.has_matrix:
            suite.cases(block)
        if suite.section("fidelity", block) is not None:
            suite.fidelity_spec(block)
        if suite.section("headroom", block) is not None:
            suite.headroom_spec(block)
    return suite
