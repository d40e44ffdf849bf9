"""Suite files: load YAML, validate every field with a one-line message per problem, expand to cases.

A suite is a matrix (models x image_size/seq_len x batch_sizes x channels_last x nproc_per_node x
precisions) plus run settings. A `cpu:` or `cuda:` block replaces top-level settings on that device type, so the
same file runs on a laptop with smaller batches and fewer steps.

  schema.py   the value objects (Case, Suite, ...) and DEFAULTS, every field's default in one table
  checks.py   validator building blocks (integer, axis, choice, check_keys, ...)
  fields.py   the field tables: settings, models: entries, optimizer, fidelity:, headroom:; validate_overrides
  load.py     reading the YAML: load_suite
  executor.py the `executor:` block (where the cases run: here, or SLURM jobs): ExecutorSpec
  options.py  every command-line option that sets a field, declared once: a new option is an entry there
  matrix.py   Suite, and per device type: settings, the case matrix, the fidelity and headroom specs

Torch-free: model references and datasets are checked through modules imported at call time.
"""
from amp_bench.errors import SuiteError
from amp_bench.suite.checks import Problems
from amp_bench.suite.executor import ExecutorSpec, executor_spec
from amp_bench.suite.fields import (
    DEVICE_BLOCKS,
    DIST_BACKENDS,
    FIDELITY_MODELS,
    HEADROOM_FIELDS,
    MAX_BATCH_SIZE,
    MAX_PROCS,
    OPTIMIZER_IMPLS,
    OPTIMIZERS,
    SECTIONS,
    SETTING_KEYS,
    TOP_ONLY,
    validate_overrides,
)
from amp_bench.suite.load import load_suite
from amp_bench.suite.matrix import Suite, check_distributed, check_duplicates, expand
from amp_bench.suite.schema import DEFAULTS, Case, FidelitySpec, HeadroomSpec, ModelSpec, OptimizerSpec

__all__ = [
    "Case", "DEFAULTS", "ExecutorSpec", "executor_spec", "DEVICE_BLOCKS", "DIST_BACKENDS", "FIDELITY_MODELS",
    "FidelitySpec", "HEADROOM_FIELDS", "HeadroomSpec", "MAX_BATCH_SIZE", "MAX_PROCS", "ModelSpec", "OPTIMIZERS",
    "OPTIMIZER_IMPLS", "OptimizerSpec", "Problems", "SECTIONS", "SETTING_KEYS", "Suite", "SuiteError", "TOP_ONLY",
    "check_distributed", "check_duplicates", "expand", "load_suite", "validate_overrides",
]
