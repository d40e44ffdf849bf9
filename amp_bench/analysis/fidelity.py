"""Fidelity results, torch-free: the verdict per precision against fp32 (paired
by seed, against fp32's own seed-to-seed range), which rows failed, and the loader the report uses.
The study itself runs in amp_bench.studies.fidelity."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from amp_bench.store.columns import STUDY_TABLES
from amp_bench.store.flags import text


def verdicts(runs: pd.DataFrame, tolerance_pp: float | dict) -> pd.DataFrame:
    """One row per run, dataset, model and precision: mean held-out accuracy, its difference from
    fp32 paired by seed (percentage points), fp32's own seed-to-seed range for scale, the final
    training-loss difference, and a verdict: parity (|difference| <= tolerance), worse, better,
    or why there is none. A mode with a second reference (modes.Mode.also_against: fp8 against bf16)
    gets the same difference and verdict against it too."""
    from amp_bench import modes
    columns = ["run_id", "dataset", "model", "precision", "seeds", "paired_seeds", "status", "test_accuracy",
               "accuracy_diff_pp", "accuracy_diff_pp_min", "accuracy_diff_pp_max", "fp32_seed_range_pp",
               "final_train_loss", "train_loss_rel_diff", "tolerance_pp", "verdict", "also_against",
               "accuracy_diff_also_pp", "verdict_also"]
    if runs.empty:
        return pd.DataFrame(columns=columns)
    rows = []
    for (run_id, dataset, model), group in runs.groupby(["run_id", "dataset", "model"], sort=False):
        tol = tolerance_pp.get(run_id, 1.0) if isinstance(tolerance_pp, dict) else tolerance_pp
        ok_runs = {p: g[g["status"] == "ok"].set_index("seed") for p, g in group.groupby("precision", sort=False)}
        fp32 = ok_runs.get("fp32", pd.DataFrame(columns=["test_accuracy"]))
        fp32_range = (fp32["test_accuracy"].max() - fp32["test_accuracy"].min()) * 100 if len(fp32) > 1 else np.nan
        for precision, runs_p in group.groupby("precision", sort=False):
            ok = ok_runs[precision]
            row = {"run_id": run_id, "dataset": dataset, "model": model, "precision": precision, "seeds": len(runs_p),
                   "status": "ok" if len(ok) == len(runs_p) else ", ".join(sorted(set(runs_p["status"]) - {"ok"})),
                   "test_accuracy": ok["test_accuracy"].mean() if len(ok) else np.nan,
                   "final_train_loss": ok["final_train_loss"].mean() if len(ok) else np.nan,
                   "fp32_seed_range_pp": fp32_range, "tolerance_pp": tol}
            if precision == "fp32":
                row["verdict"] = "reference" if len(ok) else f"reference {row['status']}"
            else:
                row.update(_against(ok, fp32, "fp32", row["status"], tol))
                also = modes.get(precision).also_against if precision in modes.names() else ""
                if also:
                    second = _against(ok, ok_runs.get(also, pd.DataFrame()), also, row["status"], tol)
                    row.update(also_against=also, accuracy_diff_also_pp=second.get("accuracy_diff_pp"),
                               verdict_also=second["verdict"])
            rows.append(row)
    return pd.DataFrame(rows, columns=columns)


def _against(ok: pd.DataFrame, reference: pd.DataFrame, name: str, status: str, tol: float) -> dict:
    """The paired-by-seed accuracy and loss difference from one reference precision, and the verdict."""
    if not len(ok):
        return {"verdict": f"not measured ({status})"}
    paired = ok.index.intersection(reference.index) if len(reference) else []
    if not len(paired):
        return {"verdict": f"no {name} baseline"}
    diff = (ok.loc[paired, "test_accuracy"] - reference.loc[paired, "test_accuracy"]) * 100
    loss_diff = (ok.loc[paired, "final_train_loss"] - reference.loc[paired, "final_train_loss"]) / \
        reference.loc[paired, "final_train_loss"].abs()
    # rounded: 0.96 - 0.97 is -1.0000000000000009 pp in floats, which must still meet a 1 pp tolerance
    mean = round(float(diff.mean()), 9)
    return {"accuracy_diff_pp": mean, "accuracy_diff_pp_min": diff.min(), "accuracy_diff_pp_max": diff.max(),
            "train_loss_rel_diff": loss_diff.mean(), "paired_seeds": len(paired),
            "verdict": "parity" if abs(mean) <= tol else "worse" if mean < 0 else "better"}


def failed_rows(runs: pd.DataFrame, allow_unsupported: bool = True) -> list[str]:
    """'precision seed N: status (reason)' for every run that did not finish ok: the CLI exits 1 on
    any. `unsupported` (the hardware has no such mode) is a finding, not a failure, unless the
    caller needs every row measured (the GPU check)."""
    allowed = {"ok", "unsupported"} if allow_unsupported else {"ok"}
    out = []
    for _, row in runs.iterrows():
        if row.get("status") not in allowed:
            reason = text(row.get("reason")).strip()
            out.append(f"{row.get('precision')} seed {row.get('seed')}: {row.get('status')}"
                       + (f" ({reason.splitlines()[0][:200]})" if reason else ""))
    return out


def load_fidelity(run_dirs: list[Path]) -> dict[str, pd.DataFrame]:
    """The fidelity tables of these run directories (empty frames where there are none), and the
    tolerance each run was judged with."""
    from amp_bench.store.results import read_manifest, read_table
    out = {name: read_table(run_dirs, name) for name in STUDY_TABLES if name.startswith("fidelity")}
    tolerance = {}
    for d in run_dirs:
        manifest = read_manifest(d) or {}
        if "fidelity" in manifest:
            tolerance[manifest.get("run_id", d.name)] = manifest["fidelity"].get("tolerance_pp", 1.0)
    out["verdicts"] = verdicts(out["fidelity"], tolerance)
    return out
