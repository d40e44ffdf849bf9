"""Advice: what to change, predicted and checked. `advise(evidence)` ranks the rules that apply to one
profiled step (rules.py) on what it saw (evidence.py); `run --try` measures the changed case beside the
original. docs/advice.md has the rules, their sources and their scores."""
from amp_bench.analysis.advice.evidence import Evidence, from_row  # noqa: F401
from amp_bench.analysis.advice.rules import RULES, Advice, advise, intrinsic  # noqa: F401
