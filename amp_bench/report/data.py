"""The report's data, without any plotting: which results, paired how, compared with which claims.

Everything here is a pandas table, so it is tested directly and written out as CSV beside the HTML.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from amp_bench import identity, modes
from amp_bench.analysis.speedups import summarize
from amp_bench.errors import UserError
from amp_bench.stats import measured as measured_samples
from amp_bench.store import results
from amp_bench.store.flags import is_true, text_column

# The seed articles' claims: "AMP is 1.5-3x faster and uses 40-50% less memory".
CLAIMED_SPEEDUP = (1.5, 3.0)
CLAIMED_MEMORY_SAVING = (0.40, 0.50)


@dataclass
class ReportData:
    run_dirs: list[Path]
    results: pd.DataFrame
    samples: pd.DataFrame
    manifests: list[dict] = field(default_factory=list)
    fidelity: dict = field(default_factory=dict)  # fidelity.load_fidelity's tables
    headroom: dict = field(default_factory=dict)  # headroom.load_headroom's tables
    prices: dict = field(default_factory=dict)  # GPU -> price per GPU-hour (report --prices; none built in)
    reference: str | None = None  # report --reference GPU: the GPUs-compared view divided by this GPU

    @property
    def headroom_runs(self) -> set:
        return {m.get("run_id") for m in self.manifests if m.get("kind") == "headroom"}

    @property
    def unfinished_runs(self) -> list[tuple[str, str]]:
        """(run, its state and why) for every run that did not finish: its rows are shown as far as they go."""
        from amp_bench.store.run_state import run_state
        states = [(Path(run_dir).name, run_state(run_dir)) for run_dir in self.run_dirs]
        return [(name, f"{s.state}: {s.detail}") for name, s in states if s.state not in ("complete", "unknown")]

    @property
    def has_benchmarks(self) -> bool:
        return not self.results.empty

    @property
    def has_fidelity(self) -> bool:
        return bool(self.fidelity) and not self.fidelity["fidelity"].empty

    @property
    def has_headroom(self) -> bool:
        return bool(self.headroom) and not self.headroom["headroom"].empty

    @property
    def summary(self) -> pd.DataFrame:
        if self._summary is None:
            self._summary = summarize(self.results)
            self._summary["machine"] = machine_label(self._summary)
        return self._summary.copy()

    @property
    def gpus(self) -> pd.DataFrame:
        """analysis/gpus.compare_gpus of these results (with the prices): the figure, the HTML, markdown and
        CSV sections and the --reference check all read it."""
        if self._gpus is None:
            from amp_bench.analysis.gpus import compare_gpus, with_predictions
            from amp_bench.store.results import read_table
            self._gpus = with_predictions(compare_gpus(self.summary, self.results, self.prices),
                                          read_table(self.run_dirs, "predicted"))
        return self._gpus.copy()

    _summary = None  # computed once: every section reads it
    _gpus = None


def collect(inputs: list[str | Path], prices: dict | None = None, reference: str | None = None) -> ReportData:
    from amp_bench.analysis.fidelity import load_fidelity
    from amp_bench.analysis.headroom import load_headroom
    run_dirs = results.find_run_dirs(inputs)
    frame = results.read_table(run_dirs, results.RESULTS_FILE[: -len(".csv")], results.RESULT_COLUMNS)
    samples = results.read_table(run_dirs, results.SAMPLES_FILE[: -len(".csv")], results.SAMPLE_COLUMNS)
    try:
        fidelity, headroom = load_fidelity(run_dirs), load_headroom(run_dirs)
    except (ValueError, pd.errors.ParserError) as exc:
        raise UserError(f"{', '.join(map(str, run_dirs))}: unreadable fidelity or headroom table ({exc})") from None
    manifests = results.read_manifests(run_dirs)
    data = ReportData(run_dirs, frame, samples, manifests, fidelity, headroom, prices or {}, reference)
    if not (data.has_benchmarks or data.has_fidelity or data.has_headroom):
        raise UserError(f"{', '.join(map(str, inputs))}: the results tables are empty (no finished case yet)")
    return data


def machine_label(frame: pd.DataFrame) -> pd.Series:
    """'NVIDIA H200 (Hopper) @ host', and '[partition]' for a SLURM run's rows: what a reader calls the
    machine a row came from (two partitions on one node are two machines)."""
    arch, host = text_column(frame, "architecture"), text_column(frame, "hostname")
    name = text_column(frame, "device_name")
    name = name.where(name.ne(""), "?")
    label = name.where(arch.eq("") | arch.eq("CPU"), name + " (" + arch + ")")
    label = label.where(host.eq(""), label + " @ " + host)
    partition = text_column(frame, "slurm_partition")
    return label.where(partition.eq(""), label + " [" + partition + "]")


def verdict(value: float, band: tuple[float, float], missing: str = "not measured") -> str:
    if value is None or not np.isfinite(value):
        return missing
    if value < band[0]:
        return "below"
    return "above" if value > band[1] else "within"


def _qualified(text: str, case: pd.Series, base: str) -> str:
    """A verdict on an emulated or contended figure says so: it does not test the claim."""
    if is_true(case.get(f"contended_vs_{base}")):
        return f"{text} (contended: not a test of the claim)"
    return modes.with_emulated(text, is_true(case.get("emulated")), f"no native {case['precision']} hardware")


def claims_table(summary: pd.DataFrame, headroom_runs: set | frozenset = frozenset()) -> pd.DataFrame:
    """Each AMP case's speedup and memory saving next to the seed articles' claims, against fp32 and,
    where it was run, against tf32 (the picture changes on Ampere and later). Headroom runs measure
    each precision at its own largest batch, so there is no same-batch baseline to claim against."""
    keys = identity.group_keys()
    rows = []
    amp = summary[summary["precision"].isin(modes.amp_names()) & ~summary["run_id"].isin(headroom_runs)]
    # a later baseline (tf32) is worth a row where it could run (measured, or failed for a reason worth seeing)
    ref = modes.reference()
    later = summary[(summary["precision"].isin(modes.baseline_names()[1:])) & (summary["status"] != "unsupported")]
    later_groups = set((*map(str, r[keys]), r["precision"]) for _, r in later.iterrows())
    baselines = summary[summary["precision"].isin(modes.baseline_names())]
    baseline_status = {(*map(str, r[keys]), r["precision"]): r["status"] for _, r in baselines.iterrows()}
    for _, case in amp.iterrows():
        for base in modes.baseline_names():
            if base != ref and (*map(str, case[keys]), base) not in later_groups:
                continue
            speedup = case[f"speedup_vs_{base}"]
            cpu = case["device"] == "cpu"
            # on a CPU the claim is about the model's memory: leave out the torch runtime's own RSS
            saving_column = f"mem_saving_above_baseline_vs_{ref}" if cpu else f"mem_saving_vs_{ref}"
            saving = case[saving_column] if base == ref else np.nan
            base_status = baseline_status.get((*map(str, case[keys]), base), "absent")
            missing = f"{base} baseline {base_status}" if base_status != "ok" else "not measured"
            rows.append({
                "machine": case["machine"], "model": case["model_label"], "batch_size": int(case["batch_size"]),
                "channels_last": bool(case["channels_last"]), "precision": case["precision"], "baseline": base,
                "status": case["status"], "speedup": speedup,
                "speedup_claim": f"{CLAIMED_SPEEDUP[0]}-{CLAIMED_SPEEDUP[1]}x",
                "speedup_verdict": _qualified(verdict(speedup, CLAIMED_SPEEDUP, missing), case, base)
                if case["status"] == "ok" else case["status"],
                "memory_saving": saving,
                "memory_claim": f"{CLAIMED_MEMORY_SAVING[0]:.0%}-{CLAIMED_MEMORY_SAVING[1]:.0%}",
                "memory_verdict": (verdict(saving, CLAIMED_MEMORY_SAVING, missing) if base == ref
                                   else f"n/a (vs {ref} only)") if case["status"] == "ok" else case["status"],
                "memory_metric": "peak RSS above pre-model RSS" if cpu else "peak allocated",
            })
    return pd.DataFrame(rows, columns=[
        "machine", "model", "batch_size", "channels_last", "precision", "baseline", "status", "speedup",
        "speedup_claim", "speedup_verdict", "memory_saving", "memory_claim", "memory_verdict", "memory_metric"])


ENV_COLUMNS = ["device_name", "architecture", "hostname", "torch_version", "cuda_version", "cudnn_version",
               "driver_version", "python_version", "transformers_version", "cpu_model", "num_threads", "cpu_allocator",
               "optimizer", "optimizer_impl", "cudnn_benchmark", "tf32_matmul", "tf32_cudnn", "power_limit_w",
               "fingerprint"]


def environment_table(data: ReportData) -> pd.DataFrame:
    """One row per run with what can change a result; attrs["differs"] lists the columns that vary."""
    frame = data.results.copy()
    frame["machine"] = machine_label(frame)
    manifests = {m.get("run_id"): m for m in data.manifests}
    rows = []
    for run_id, group in frame.groupby("run_id", sort=False):
        # ok rows first: a failed or unsupported case leaves most columns empty
        ordered = pd.concat([group[group["status"] == "ok"], group[group["status"] != "ok"]])
        row = {"run_id": run_id, "machine": ordered["machine"].iloc[0], "suite": ordered.get("suite").iloc[0]}
        for column in ENV_COLUMNS:
            values = ordered[column].dropna() if column in ordered else pd.Series(dtype=object)
            row[column] = str(values.iloc[0]) if not values.empty else ""
        manifest = manifests.get(run_id, {})
        for key in ("python_version", "transformers_version", "cudnn_version"):  # versions only it holds
            row[key] = str((manifest.get("versions") or {}).get(key) or row[key])
        row["cpu_model"] = str((manifest.get("device") or {}).get("cpu_model") or row["cpu_model"])
        rows.append(row)
    table = pd.DataFrame(rows)
    table = table[[c for c in table.columns if c in ("run_id", "machine", "suite") or (table[c] != "").any()]]
    table.attrs["differs"] = [c for c in table.columns if c not in ("run_id", "machine", "suite")
                              and table[c].nunique() > 1]
    return table


def not_measured(results: pd.DataFrame) -> pd.DataFrame:
    """Every case that did not produce a measurement, with why (repeats that failed alike, merged)."""
    bad = results[results["status"] != "ok"].copy()
    columns = ["machine", "case_id", "status", "repeats", "reason"]
    if bad.empty:
        return pd.DataFrame(columns=columns)
    bad["machine"] = machine_label(bad)
    bad["reason"] = text_column(bad, "reason")
    merged = bad.groupby(["machine", "case_id", "status", "reason"], sort=False)["repeat"].agg(
        lambda r: ", ".join(str(int(x)) for x in sorted(r))).rename("repeats").reset_index()
    return merged[columns]


def step_samples(data: ReportData) -> pd.DataFrame:
    """Measured per-step times joined with what the case was, for distribution plots."""
    if data.samples.empty:
        return data.samples
    measured = measured_samples(data.samples)
    info = data.results.reindex(columns=["run_id", "case_id", "repeat", *identity.case_axes(), "device_name",
                                         "hostname", "architecture"]).drop_duplicates(["run_id", "case_id", "repeat"])
    joined = measured.merge(info, on=["run_id", "case_id", "repeat"], how="inner")
    joined["machine"] = machine_label(joined)
    return joined


def precision_sort_key(values: pd.Series) -> pd.Series:
    return values.map(modes.order_key)
