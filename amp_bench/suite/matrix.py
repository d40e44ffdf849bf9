"""What a validated suite becomes on one device type: its settings, its cases, its study specs.

The settings are the top level's, replaced by the device's cpu:/cuda: block, then by overrides. The
matrix (models x image_size/seq_len x batch_sizes x channels_last x nproc_per_node x precisions)
expands to Cases; check_distributed and check_duplicates catch what is only wrong in combination.
The fidelity and headroom sections become a FidelitySpec / HeadroomSpec, defaults from schema.DEFAULTS.
The Suite methods of the same names call these.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path

from amp_bench import modes
from amp_bench.errors import SuiteError
from amp_bench.identity import EAGER
from amp_bench.suite import fields
from amp_bench.suite.checks import Problems
from amp_bench.suite.schema import DEFAULTS, Case, FidelitySpec, HeadroomSpec, OptimizerSpec, compile_mode_name


def settings_for(suite: Suite, device_type: str, overrides: dict | None = None) -> dict:
    settings = {**suite.settings, **suite.blocks.get(device_type, {})}
    if overrides:
        given = fields.validate_overrides(overrides, suite.path)
        if "steps" in given and not ADAPTIVE_KEYS & set(given):
            # `--steps N` asks for exactly N steps: it switches off an adaptive window from the file
            settings.update({key: None for key in ADAPTIVE_KEYS})
        settings.update(given)
    return settings


ADAPTIVE_KEYS = {"target_ci", "case_budget_s", "budget_s"}


def cases_for(suite: Suite, device_type: str, overrides: dict | None = None) -> list[Case]:
    settings = suite.settings_for(device_type, overrides)
    if "models" not in settings or "batch_sizes" not in settings:
        raise SuiteError(f"{suite.path}: models, batch_sizes: missing (this suite has no benchmark matrix; "
                         "`amp_bench fidelity` runs its fidelity section)")
    check_distributed(settings, device_type, suite.path)
    cases = expand(suite, settings)
    check_duplicates(cases, suite.path)
    return cases


def expand(suite: Suite, settings: dict) -> list[Case]:
    cases = []
    for spec in settings["models"]:
        kind = spec.kind
        image_sizes = settings["image_size"] if kind == "torchvision" else [None]
        seq_lens = settings["seq_len"] if kind == "transformers" else [None]
        layouts = settings["channels_last"] if kind != "transformers" else [False]
        procs = list(spec.nproc_per_node or settings["nproc_per_node"])
        compile_modes = [compile_mode_name(m) for m in (spec.compile or settings["compile"])]
        precisions = list(spec.precisions or settings["precisions"])
        compiled_precisions = settings["compile_precisions"] or precisions
        seen = set()
        for image_size, seq_len, batch_size, channels_last, nproc, compile_mode, precision in itertools.product(
                image_sizes, seq_lens, settings["batch_sizes"], layouts, procs, compile_modes, precisions):
            if compile_mode_name(compile_mode) != EAGER and precision not in compiled_precisions:
                continue  # compile_precisions: compiled cases only for these (eager runs every precision)
            if spec.compile is None:  # a model entry's own compile: axis is taken as written
                compile_mode, note = _compile_for(precision, compile_mode, settings)
            else:
                note = ""
            key = (image_size, seq_len, batch_size, channels_last, nproc, compile_mode, precision)
            if key in seen:  # fp8 compiled by default and the axis' own compiled case: one case
                continue
            seen.add(key)
            cases.append(Case(
                suite=suite.name, model=spec, batch_size=batch_size, precision=precision,
                channels_last=channels_last, image_size=image_size, seq_len=seq_len,
                warmup_steps=settings["warmup_steps"], steps=settings["steps"], repeats=settings["repeats"],
                optimizer=settings["optimizer"], seed=settings["seed"], timeout_s=_timeout(compile_mode, settings),
                allow_emulated=settings["allow_emulated"], cudnn_benchmark=settings["cudnn_benchmark"],
                target_ci=settings["target_ci"], min_steps=settings["min_steps"], max_steps=settings["max_steps"],
                case_budget_s=settings["case_budget_s"], budget_s=settings["budget_s"],
                peak_tflops=(settings["peak_tflops"] or {}).get(precision),
                nvml_interval_ms=settings["nvml_interval_ms"], on_contention=settings["on_contention"],
                interleave=settings["interleave"], cpu_allocator=settings["cpu_allocator"],
                repeats_per_worker=settings["repeats_per_worker"],
                search_dirs=(str(suite.path.resolve().parent),),
                nproc_per_node=nproc, nnodes=settings["nnodes"], dist_backend=settings["dist_backend"],
                threads_per_rank=settings["threads_per_rank"], rdzv_endpoint=settings["rdzv_endpoint"],
                rdzv_id=settings["rdzv_id"], compile_mode=compile_mode,
                compile_backend=settings["compile_backend"], compile_fullgraph=settings["compile_fullgraph"],
                compile_optimizer=settings["compile_optimizer"], compile_cache=settings["compile_cache"],
                compile_note=note, fp8_recipe=settings["fp8_recipe"],
                explain=settings["explain"] if spec.explain is None else spec.explain,
                fp8_skip_first_last=settings["fp8_skip_first_last"]))
    return cases


def _timeout(compile_mode: str, settings: dict) -> float:
    """A compiled case's deadline covers a cold compile too: compile_timeout_s where given."""
    if compile_mode_name(compile_mode) != EAGER and settings["compile_timeout_s"] is not None:
        return settings["compile_timeout_s"]
    return settings["timeout_s"]


def _compile_for(precision: str, compile_mode: str, settings: dict) -> tuple[str, str]:
    """(compile mode, note): a mode that is only fast compiled (fp8) trains compiled where the axis
    says eager, unless fp8_compile: false; the note says so in the row."""
    if compile_mode_name(compile_mode) == EAGER and modes.get(precision).compiled_by_default \
            and settings["fp8_compile"]:
        return "default", (f"{precision} trains under torch.compile by default (float8 is only fast compiled; "
                           "fp8_compile: false measures it eager)")
    return compile_mode, ""


def check_distributed(settings: dict, device_type: str, path: Path) -> None:
    """Settings that are fine one by one but not together."""
    where = "" if device_type not in fields.DEVICE_BLOCKS else f" (on {device_type})"
    problems = []
    uses_ddp = any(n is not None for n in settings["nproc_per_node"]) or \
        any(m.nproc_per_node for m in settings["models"])
    if settings["nnodes"] > 1 and not uses_ddp:
        problems.append(f"nnodes: {settings['nnodes']} nodes need nproc_per_node (processes per node){where}")
    if settings["nnodes"] > 1 and not settings["rdzv_endpoint"]:
        problems.append(f"rdzv_endpoint: missing: nnodes: {settings['nnodes']} needs the HOST:PORT every node "
                        f"meets at (node 0's address){where}")
    if settings["min_steps"] > settings["max_steps"]:
        problems.append(f"min_steps: {settings['min_steps']} is more than max_steps: {settings['max_steps']}{where}")
    if problems:
        raise SuiteError([f"{path}: {p}" for p in problems])


def check_duplicates(cases: list[Case], path: Path) -> None:
    seen: set[str] = set()
    dupes = []
    for case in cases:
        if case.case_id in seen:
            dupes.append(f"{path}: models: duplicate case {case.case_id!r}")
        seen.add(case.case_id)
    if dupes:
        raise SuiteError(dupes)


# --------------------------------------------------------------------------- study specs

def _given(overrides: dict | None) -> dict:
    """Overrides set to None are not given (the CLI passes every option, set or not)."""
    return {k: v for k, v in (overrides or {}).items() if v is not None}


def fidelity_spec(suite: Suite, device_type: str, overrides: dict | None = None) -> FidelitySpec:
    section = suite.section("fidelity", device_type)
    if section is None:
        raise SuiteError(f"{suite.path}: fidelity: missing (add a fidelity: section, e.g. "
                         "{dataset: digits, epochs: 10}, to run the fidelity study)")
    settings = suite.settings_for(device_type)
    problems: Problems = []
    section = {**section, **(fields.validate_fidelity(_given(overrides), "override", problems) or {})}
    fields.check_fidelity_combination(section, "fidelity", problems)
    if problems:
        raise SuiteError([f"{suite.path}: {p}" for p in problems])
    return _fidelity_spec(suite, settings, section)


def _fidelity_spec(suite: Suite, settings: dict, section: dict) -> FidelitySpec:
    defaults = DEFAULTS["fidelity"]
    given = {**defaults, **section}
    dataset, model = fields.fidelity_dataset_and_model(section)
    precisions = list(given["precisions"] or settings["precisions"])
    precisions = ["fp32"] + [p for p in precisions if p != "fp32"]  # the reference always runs, first
    # a validated section's optimizer is already an OptimizerSpec (its gaps filled from DEFAULTS["optimizer"])
    optimizer = section.get("optimizer") or OptimizerSpec(**defaults["optimizer"])
    return FidelitySpec(suite=suite.name, dataset=dataset, model=model, epochs=given["epochs"],
                        batch_size=given["batch_size"], seeds=tuple(given["seeds"] or [settings["seed"]]),
                        precisions=tuple(precisions), optimizer=optimizer, test_fraction=given["test_fraction"],
                        image_size=given["image_size"] if model.startswith("torchvision/") else None,
                        tolerance_pp=given["tolerance_pp"], probe_every=given["probe_every"],
                        timeout_s=settings["timeout_s"] if given["timeout_s"] is None else given["timeout_s"],
                        allow_emulated=settings["allow_emulated"], compile_mode=compile_mode_name(given["compile"]),
                        compile_backend=settings["compile_backend"], compile_fullgraph=settings["compile_fullgraph"],
                        fp8_recipe=settings["fp8_recipe"], fp8_skip_first_last=settings["fp8_skip_first_last"])


def headroom_spec(suite: Suite, device_type: str, overrides: dict | None = None) -> HeadroomSpec:
    problems: Problems = []
    section = {**(suite.section("headroom", device_type) or {}),
               **(fields.validate_headroom(_given(overrides), "override", problems) or {})}
    if problems:
        raise SuiteError([f"{suite.path}: {p}" for p in problems])
    given = {**DEFAULTS["headroom"], **section}
    batch_sizes = suite.settings_for(device_type).get("batch_sizes") or [1]
    cap = given["memory_cap_gb"]
    start = given["start_batch_size"]
    spec = HeadroomSpec(memory_cap_bytes=int(cap * 2**30) if cap else None,
                        start_batch_size=min(batch_sizes) if start is None else start,
                        max_batch_size=given["max_batch_size"], resolution=given["resolution"],
                        probe_steps=given["probe_steps"], measure=given["measure"])
    if spec.start_batch_size > spec.max_batch_size:
        raise SuiteError(f"{suite.path}: headroom.start_batch_size: {spec.start_batch_size} is above "
                         f"max_batch_size {spec.max_batch_size}")
    return spec


@dataclass
class Suite:
    """A validated suite file and what it expands to per device type (the functions below)."""
    path: Path
    name: str
    description: str
    device: str
    sha256: str
    text: str
    settings: dict  # validated top-level settings (defaults filled in)
    blocks: dict  # device type -> validated override settings
    fidelity: dict | None = None  # validated `fidelity:` section (top level; blocks may override)
    headroom: dict | None = None
    executor: dict = field(default_factory=dict)  # validated `executor:` block (suite/executor.py)
    predict: dict | None = None  # validated `predict:` block: targets, fp32_as (analysis/predict/)

    @property
    def has_matrix(self) -> bool:
        return "models" in self.settings and "batch_sizes" in self.settings

    def section(self, name: str, device_type: str) -> dict | None:
        top = getattr(self, name)
        override = self.blocks.get(device_type, {}).get(name)
        if top is None and override is None:
            return None
        return {**(top or {}), **(override or {})}

    def fidelity_spec(self, device_type: str, overrides: dict | None = None) -> FidelitySpec:
        return fidelity_spec(self, device_type, overrides)

    def headroom_spec(self, device_type: str, overrides: dict | None = None) -> HeadroomSpec:
        return headroom_spec(self, device_type, overrides)

    def settings_for(self, device_type: str, overrides: dict | None = None) -> dict:
        return settings_for(self, device_type, overrides)

    def cases(self, device_type: str, overrides: dict | None = None) -> list[Case]:
        return cases_for(self, device_type, overrides)
