"""`explain SUITE`: run a suite with `explain: true` (3-8 profiled steps per case after its first timed
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
        status = self.results.get("explain_status", pd.Series(dtype=object))
        return not status.isin(["ok", "distorted"]).any()


def unexplained_lines(results: pd.DataFrame) -> list[str]:
    """One line per case without a breakdown: its status and why, with the repeats it held for
    ('(repeats 0, 2)') when not every repeat of the case went the same way."""
    found: dict[tuple[str, str], list[int]] = {}
    repeats: dict[str, int] = {}
    for _, row in results.iterrows():
        case_id = str(row["case_id"])
        repeats[case_id] = repeats.get(case_id, 0) + 1
        status, explained = row.get("status"), row.get("explain_status")
        not_profiled = not isinstance(explained, str) or not explained
        if status == "ok" and (explained in ("ok", "distorted")
                               or (not_profiled and int(row.get("repeat", 0) or 0) > 0)):
            continue  # a later repeat is not profiled (launchers/launch.run_one): nothing is missing
        if status != "ok":
            why = f"{status}: {row.get('reason') or ''}"
        else:
            why = (f"{status}: profile {explained if isinstance(explained, str) else 'not taken'}: "
                   f"{row.get('explain_reason') or ''}")
        found.setdefault((case_id, why.rstrip(": ")), []).append(int(row.get("repeat", 0) or 0))
    lines = []
    for (case_id, why), held in found.items():
        which = "" if len(held) == repeats[case_id] else \
            f" (repeat{'s' if len(held) > 1 else ''} {', '.join(map(str, sorted(held)))})"
        lines.append(f"{case_id}{which}: {why}")
    return lines


def explain_suite(path: str | Path, *, device: str | None = None, results_dir: str | Path = "results",
                  reporter: Reporter | None = None, **overrides) -> Explained:
    """Run the suite with explain on (other `overrides` as run_suite takes them)."""
    results = run_suite(path, device=device, results_dir=results_dir, reporter=reporter,
                        **{**overrides, "explain": True})
    return Explained(results, unexplained_lines(results), sentences(results))
