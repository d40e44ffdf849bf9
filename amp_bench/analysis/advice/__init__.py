"""Advice: what to change, predicted and checked. `assess(evidence)` ranks every item the rules (rules.py)
price for one profiled step on what it saw (evidence.py: the row, the files beside its trace, the shape probe's
readings, probe.py; its casts, casts.py); `advise(evidence)` keeps the items that are advice (a gain whose whole
interval lies above 1.0x); `run --try` measures any item beside the original. docs/advice.md has the rules,
their sources and their scores."""
from amp_bench.analysis.advice.evidence import Evidence, from_row  # noqa: F401
from amp_bench.analysis.advice.rules import RULES, Advice, advise, assess, intrinsic  # noqa: F401
