"""`explain SUITE`: run a suite with `explain: true` (one profiled step per case after its timed
window) and gather what the command prints: the cases without a breakdown, one line each, and one
sentence per model, batch and mode saying why its speedup is what it is. The breakdown itself is
judged in the parent as every run's is (studies/benchmark.py -> analysis/explain/judge.py)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from amp_bench.analysis.explain.decompose import sentences
from amp_bench.studies.benchmark import Reporter, run_suite


@dataclass
class Explained:
    results: pd.DataFrame
    unexplained: list[str] = field(default_factory=list)  # one line per case and repeat without a breakdown
    sentences: list[str] = field(default_factory=list)

    @property
    def nothing(self) -> bool:
        """No row has a breakdown: every case failed, was unsupported or its profile was unavailable."""
        return len(self.unexplained) == len(self.results)


def unexplained_lines(results: pd.DataFrame) -> list[str]:
    """One line per case and repeat without a breakdown: its status and why."""
    lines = []
    for _, row in results.iterrows():
        status, explained = row.get("status"), row.get("explain_status")
        if status == "ok" and explained in ("ok", "distorted"):
            continue
        if status != "ok":
            why = row.get("reason")
        else:
            why = f"profile {explained if isinstance(explained, str) else 'not taken'}: {row.get('explain_reason') or ''}"
        lines.append(f"{row['case_id']} (repeat {row.get('repeat', 0)}): {status}: {why}".rstrip(": "))
    return lines


def explain_suite(path: str | Path, *, device: str | None = None, results_dir: str | Path = "results",
                  reporter: Reporter | None = None, **overrides) -> Explained:
    """Run the suite with explain on (other `overrides` as run_suite takes them)."""
    results = run_suite(path, device=device, results_dir=results_dir, reporter=reporter,
                        **{**overrides, "explain": True})
    return Explained(results, unexplained_lines(results), sentences(results))
