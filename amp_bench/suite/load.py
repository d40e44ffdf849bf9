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
from amp_bench.suite import checks, fields
from amp_bench.suite.checks import Problems
from amp_bench.suite.executor import validate_executor
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


_SECTIONS = {"fidelity": fields.validate_fidelity, "headroom": fields.validate_headroom}  # fields.SECTIONS' checks


def load_suite(path: str | Path) -> Suite:
    """Read and validate a suite. Raises SuiteError listing every problem found."""
    path = Path(path)
    text, data = _read(path)
    problems: Problems = []
    if data is None:
        raise SuiteError(f"{path}: empty suite file (expected a mapping with at least 'models' and 'batch_sizes')")
    if not isinstance(data, dict):
        raise SuiteError(f"{path}: expected a mapping at the top level, got {checks.type_name(data)}")
    search_dirs = (str(path.resolve().parent),)
    checks.check_keys(data, fields.SETTING_KEYS + fields.TOP_ONLY + fields.SECTIONS, "", problems)
    settings = {**DEFAULTS["settings"], "optimizer": OptimizerSpec(**DEFAULTS["settings"]["optimizer"])}
    settings.update(fields.validate_settings(data, "", problems, search_dirs))
    for required in ("models", "batch_sizes"):
        fidelity_only = "fidelity" in data or any(isinstance(data.get(b), dict) and "fidelity" in data[b]
                                                  for b in fields.DEVICE_BLOCKS)
        if required not in data and not fidelity_only:  # a fidelity-only suite needs no matrix
            problems.append(f"{required}: missing (the matrix needs models and batch_sizes)")
    sections = {key: check(data[key], key, problems) if key in data else None for key, check in _SECTIONS.items()}
    executor = validate_executor(data["executor"], "executor", problems) if "executor" in data else None
    predict = fields.validate_predict(data["predict"], "predict", problems) if "predict" in data else None
    top = DEFAULTS["suite"]
    name = checks.text(data.get("name", path.stem), "name", problems)  # the default name is derived: the file's stem
    description = data.get("description", top["description"])
    if not isinstance(description, str):
        problems.append(f"description: expected a string, got {checks.type_name(description)}")
    device = data.get("device", top["device"])
    if not (isinstance(device, str) and re.fullmatch(r"auto|cpu|cuda(:\d+)?", device)):
        problems.append(f"device: expected auto, cpu, cuda or cuda:N, got {device!r}")
    blocks = {}
    for block in fields.DEVICE_BLOCKS:
        if block not in data or checks.mapping(data[block], block, problems) is None:
            continue
        checks.check_keys(data[block], fields.SETTING_KEYS + fields.SECTIONS, block, problems)
        blocks[block] = fields.validate_settings(data[block], block, problems, search_dirs)
        for key, check in _SECTIONS.items():
            if key in data[block]:
                blocks[block][key] = check(data[block][key], f"{block}.{key}", problems)
    if problems:
        raise SuiteError([f"{path}: {p}" for p in problems])
    suite = Suite(path=path, name=name, description=description, device=device,
                  sha256=hashlib.sha256(text.encode()).hexdigest(), text=text,
                  settings=settings, blocks=blocks, executor=executor or {}, predict=predict, **sections)
    for block in fields.DEVICE_BLOCKS:  # every device's matrix must be sound, not just this machine's
        if suite.has_matrix:
            suite.cases(block)
        if suite.section("fidelity", block) is not None:
            suite.fidelity_spec(block)
        if suite.section("headroom", block) is not None:
            suite.headroom_spec(block)
    return suite
