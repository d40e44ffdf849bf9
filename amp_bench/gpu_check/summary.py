"""The GPU check's summary (scripts/gpu_check.sh --part 1 | --part 2): one markdown page and a few
flat CSVs per part that are complete whenever the check stops, and the verdict that can't pass by
accident.

The script runs a part's stages into a work folder and, after each, calls

    python3 -m amp_bench.gpu_check summary WORK OUT --part N [--final]

which reads what the stages left (WORK/stages.tsv, WORK/env.json, WORK/matmul.json, the run
directories under WORK/suite, WORK/fidelity, WORK/headroom, WORK/overhead.csv, WORK/overrides.txt),
copies the part's tables flat into OUT as partN_*.csv (at most 8 files per part come back from a
remote GPU machine) and writes OUT/partN_summary.md, via a temporary file in WORK (never a ninth file
in OUT): part 1 puts our figures beside the published anchors (docs/sources.md), beside a plain
hand-written AMP loop run in the same call, and headroom; part 2 has fp8, the explain case (its
breakdown checked, its longest kernels named), pytest -m gpu and fidelity. The stages and their
estimates are plan.py's.
`--final` prints the verdict and exits 1 unless it passed.
`python3 -m amp_bench.gpu_check matmul FILE` measures the bf16 dense matmul rate (GPU only);
`python3 -m amp_bench.gpu_check plan --part N [--shell]` prints the part's plan (plan.py).
Torch-free at import; no plotly, no scikit-learn.
"""
from __future__ import annotations

import csv
import io
import json
import os
import shutil
import sys
from pathlib import Path

import pandas as pd

from amp_bench.gpu_check import plan, tables

PARTS = {n: tuple(s.name for s in part.stages) for n, part in plan.PARTS.items()}  # in running order
STAGES = tuple(dict.fromkeys(name for names in PARTS.values() for name in names))
PRE = "pre"  # the checks before any stage: recorded only when they fail the part
TABLES = {1: ("suite", "overhead"), 2: ("suite", "fidelity", "headroom")}  # what each part copies flat into OUT
ARCHIVE = "runs.tar.gz"  # every run's manifest, tables, logs and explain traces, for later scoring
ARCHIVE_MAX_BYTES = 15 * 2**20  # the device tool brings back files of at most 16 MiB
EXPLAIN_MAX_OTHER = 0.30  # the explain case fails the check when "other" is this share of its busy time or more


def read_stages(path: Path, part: int | None = None) -> dict[str, dict]:
    """stage -> its latest line in stages.tsv (name, status, seconds, timeout, note) and its H200
    estimate; the part's stages that have no line yet are "pending" (not reached). The pre-checks
    appear only when they recorded a failure."""
    names = PARTS[part] if part else STAGES
    estimates = {s.name: s.estimate_s for s in plan.PARTS[part].stages} if part in plan.PARTS else {}
    fields = ("stage", "status", "seconds", "timeout", "note")
    order = ("stage", "status", "seconds", "estimate_s", "timeout", "note")
    stages = {name: dict(zip(fields, (name, "pending", "", "", ""), strict=True)) for name in names}
    if path.is_file() and path.stat().st_size:  # the script's lines, as written: text, no quoting, no header
        lines = pd.read_csv(path, sep="\t", names=fields, dtype=str, keep_default_na=False, quoting=csv.QUOTE_NONE,
                            engine="python", on_bad_lines=lambda cells: cells[:len(fields)], encoding_errors="replace")
        for line in lines.fillna("").to_dict("records"):
            if line["stage"] and (part is None or line["stage"] in names or line["stage"] == PRE):
                stages[line["stage"]] = line
    stages = {name: {key: {**stage, "estimate_s": estimates.get(name, "")}[key] for key in order}
              for name, stage in stages.items()}
    if PRE in stages:  # first, as it ran
        stages = {PRE: stages.pop(PRE), **stages}
    return stages


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _read(folder: Path, table: str, unreadable: list[str], nested: bool = True) -> pd.DataFrame:
    """A stage's tables through the store's one reader (`nested`: every run directory under the
    folder, else the folder's own file); a file it cannot read fails the check (listed in
    `unreadable`) instead of being skipped."""
    from amp_bench.errors import UserError
    from amp_bench.store.results import dirs_with_table, read_table
    try:
        return read_table(dirs_with_table(folder, table) if nested else [folder], table, with_run_dir=True)
    except UserError as exc:
        unreadable.append(str(exc))
        return pd.DataFrame()


def load(work: Path, part: int | None = None) -> dict:
    """Everything a part's stages left in the work folder (empty frames / dicts where a stage left nothing)."""
    unreadable: list[str] = []
    tables = {key: _read(work / key, table, unreadable)
              for key, table in (("suite", "results"), ("fidelity", "fidelity"), ("headroom", "headroom"))}
    # overhead.csv is the plain-loop cross-check's own table (not a run directory), in the work folder
    overhead = _read(work, "overhead", unreadable, nested=False)
    overrides = (work / "overrides.txt").read_text(encoding="utf-8").splitlines() \
        if (work / "overrides.txt").is_file() else []
    return {"part": part, "stages": read_stages(work / "stages.tsv", part), "env": _read_json(work / "env.json"),
            "matmul": _read_json(work / "matmul.json"), **tables, "overrides": [o for o in overrides if o.strip()],
            "overhead": overhead.drop(columns=["run_dir"], errors="ignore"), "unreadable": unreadable,
            "manifests": {f"{folder.parent.name}/{folder.name}": _read_json(folder / "manifest.json")
                          for folder in run_dirs(work)}}


def run_dirs(work: Path) -> list[Path]:
    """Every run directory the part's stages left (those with a manifest)."""
    return sorted(p.parent for key in ("suite", "fidelity", "headroom") if (work / key).is_dir()
                  for p in (work / key).glob("*/manifest.json"))


def _extra(part: int | None, stage: str) -> bool:
    return part in plan.PARTS and any(s.name == stage and s.extra for s in plan.PARTS[part].stages)


def capability(data: dict) -> tuple[int, int] | None:
    cap = (data["env"].get("device") or {}).get("capability")
    if cap:
        return int(cap[0]), int(cap[1])
    suite = data["suite"]
    if not suite.empty and "compute_capability" in suite and suite["compute_capability"].notna().any():
        major, _, minor = str(suite["compute_capability"].dropna().iloc[0]).partition(".")
        return int(float(major)), int(minor or 0)
    return None


# --------------------------------------------------------------------------- the verdict

def failures(data: dict) -> list[str]:
    """Why the check failed: a stage that failed or ran out of time; any suite case not ok, except an
    `unsupported` one whose mode this GPU does not run natively (modes.Mode.cuda_min_capability: fp16
    and bf16 from 8.0 on are required, fp8 from 8.9 on; unknown capability: unsupported is allowed);
    any fidelity or headroom row not ok; a fidelity verdict of "worse"; an AMP mode whose largest
    batch (headroom) is below fp32's."""
    from amp_bench.analysis.fidelity import failed_rows as fidelity_failed
    from amp_bench.analysis.headroom import failed_rows as headroom_failed
    # an extra stage runs on what was left, as far as it gets: its timeout is no failure, its failure is
    out = [f"stage {s['stage']}: {s['status']}" + (f" ({s['note']})" if s["note"] else "")
           for s in data["stages"].values() if s["status"] == "failed" or
           (s["status"] == "timeout" and not _extra(data.get("part"), s["stage"]))]
    out += [f"unreadable: {line}" for line in data.get("unreadable", [])]
    suite, cap = data["suite"], capability(data)
    if not suite.empty:
        for _, row in suite[suite["status"] != "ok"].iterrows():
            if row["status"] == "unsupported" and not _required(row.get("precision"), cap):
                continue
            reason = str(row.get("reason") or "").splitlines()[0][:200] if isinstance(row.get("reason"), str) else ""
            out.append(f"suite {row['case_id']}: {row['status']}" + (f" ({reason})" if reason else ""))
    for key, failed, worse in (("fidelity", fidelity_failed, worse_fidelity),
                               ("headroom", headroom_failed, less_headroom)):
        if not data[key].empty:
            out += [f"{key} {line}" for line in failed(data[key], allow_unsupported=False) + worse(data[key])]
    if cap is not None and data.get("part") == 2 and data["stages"].get("suite", {}).get("status") == "ok":
        out += explain_failures(suite)
    return out


def explain_failures(suite: pd.DataFrame) -> list[str]:
    """On a GPU, the explain case must give a breakdown that explains something: status ok, busy and
    GEMM time above zero, and "other" (kernels no rule names) under EXPLAIN_MAX_OTHER of the busy time.
    A trace without GPU events, a classifier that misses Hopper's kernel names, or a profile that
    failed would all pass unnoticed otherwise."""
    from amp_bench.store.flags import is_true
    rows = suite[suite["explain_status"].notna()] if "explain_status" in suite else suite.iloc[:0]  # an empty cell: NA
    if rows.empty:
        return ["explain: no case ran with explain on"]
    out = []
    for _, row in rows.iterrows():
        name = row["case_id"]
        if row.get("explain_status") != "ok":
            out.append(f"explain {name}: {row.get('explain_status')} ({row.get('explain_reason') or 'no reason'})")
            continue
        for column, what in (("explain_busy_ms", "busy time"), ("explain_gemm_ms", "GEMM time")):
            if not (pd.notna(row.get(column)) and float(row[column]) > 0):
                out.append(f"explain {name}: {what} is {row.get(column)} (expected above zero)")
        other = row.get("explain_other_share")
        if pd.notna(other) and float(other) >= EXPLAIN_MAX_OTHER and not is_true(row.get("emulated")):
            out.append(f"explain {name}: 'other' is {float(other):.0%} of the busy time (at most "
                       f"{EXPLAIN_MAX_OTHER:.0%}): the kernel names below are not classified")
    return out


def worse_fidelity(fidelity: pd.DataFrame) -> list[str]:
    """A precision whose test accuracy is worse than fp32's (or its also_against mode's) by more than the tolerance."""
    from amp_bench.analysis.fidelity import load_fidelity, verdicts
    if "run_dir" in fidelity:  # as the stage left it: each run judged with its suite's tolerance
        table = load_fidelity([Path(d) for d in fidelity["run_dir"].unique()])["verdicts"]
    elif {"run_id", "dataset", "model", "seed", "test_accuracy", "final_train_loss"} <= set(fidelity.columns):
        table = verdicts(fidelity, 1.0)
    else:  # rows without accuracies: nothing to judge (a row not ok has failed the check already)
        return []
    out = []
    for _, row in table.iterrows():
        for column, base in (("verdict", "fp32"), ("verdict_also", row.get("also_against"))):
            if row.get(column) == "worse":
                diff = row.get("accuracy_diff_pp" if column == "verdict" else "accuracy_diff_also_pp")
                out.append(f"{row['precision']}: worse than {base} ({diff:+.2f} pp test accuracy, "
                           f"tolerance {row.get('tolerance_pp')} pp)")
    return out


def less_headroom(headroom: pd.DataFrame) -> list[str]:
    """An AMP mode that fits a smaller largest batch than fp32 under the same cap: AMP's activations
    are smaller, so less room means something is wrong (an autocast weight cache, a leak)."""
    from amp_bench import modes
    if not {"model_label", "precision", "status", "max_batch_size"} <= set(headroom.columns):
        return []
    ok = headroom[headroom["status"] == "ok"]
    out = []
    for model, rows in ok.groupby("model_label"):
        fp32 = rows[rows["precision"] == "fp32"]["max_batch_size"]
        if fp32.empty or pd.isna(fp32.iloc[0]):
            continue
        for _, row in rows.iterrows():
            if row["precision"] in modes.amp_names() and row["max_batch_size"] < fp32.iloc[0]:
                out.append(f"{model} {row['precision']}: largest batch {row['max_batch_size']:.0f} is below fp32's "
                           f"{fp32.iloc[0]:.0f}")
    return out


def _required(precision, cap) -> bool:
    """Must this precision run on a GPU of this capability? Modes that are emulated below their
    capability (bf16, fp16) are required from 8.0, like the check always asked."""
    from amp_bench import modes
    if cap is None or precision not in modes.names():
        return False
    return cap >= max(modes.get(precision).cuda_min_capability, (8, 0))


def verdict(data: dict) -> tuple[str, list[str]]:
    """PASSED, FAILED or INCOMPLETE (a stage never ran or was cut by the budget), with the reasons. A PASSED
    with an extra stage cut short says which, in its own words: the check passed, that stage got as far as it got."""
    failed = failures(data)
    if failed:
        return "FAILED", failed
    # an extra stage the budget left no time for is as planned (the page still names it as not reached)
    unfinished = [f"stage {s['stage']}: {'cut by the budget' if s['status'] == 'budget' else 'not finished'}"
                  + (f" ({s['note']})" if s["note"] else "")
                  for s in data["stages"].values() if s["status"] == "pending" or
                  (s["status"] == "budget" and not _extra(data.get("part"), s["stage"]))]
    if unfinished:
        return "INCOMPLETE", unfinished
    on_cpu = (data["env"].get("device") or {}).get("type") == "cpu" or \
        (not data["suite"].empty and (data["suite"]["device"] == "cpu").all())
    cut = [f"{s['stage']} ({s['status']})" for s in data["stages"].values() if s["status"] in ("timeout", "budget")]
    return ("PASSED (CPU smoke only: no GPU, nothing validated on CUDA)" if on_cpu else "PASSED") + \
        (f"; extra stage{'s' if len(cut) > 1 else ''} cut short: {', '.join(cut)}" if cut else ""), []


# --------------------------------------------------------------------------- the page

def render(data: dict) -> str:
    status, reasons = verdict(data)
    env, suite = data["env"], data["suite"]
    device = env.get("device") or {}
    name = device.get("name") or (suite["device_name"].dropna().iloc[0] if not suite.empty else "unknown device")
    cap = capability(data)
    part = data.get("part")
    lines = [f"# amp_bench GPU check{f', part {part} of 2' if part else ''}", "",
             f"**{status}** on {name}" + (f" (compute capability {cap[0]}.{cap[1]})" if cap else "") + ".", ""]
    lines += [f"- {r}" for r in reasons] + ([""] if reasons else [])
    lines += [f"Environment changed for the check: {o}" for o in data.get("overrides", [])]
    lines += [""] if data.get("overrides") else []
    if device.get("type") == "cpu" or (not cap and not suite.empty and (suite["device"] == "cpu").all()):
        lines += ["No CUDA GPU: this run is the CPU smoke of the script's path; nothing here validates CUDA.", ""]
    unreached = [s["stage"] for s in data["stages"].values() if s["status"] in ("pending", "budget")]
    lines += [f"Stages not reached: {', '.join(unreached)}." if unreached else "Every stage was reached.", ""]
    lines += ["## Stages", "", tables.markdown(pd.DataFrame(data["stages"].values())), ""]
    lines += tables.environment(env)
    lines += tables.workers_lines(data.get("manifests") or {})
    if part in (None, 1):
        lines += tables.main_job_section(suite, data["stages"].get("suite"))
    if part in (None, 2):
        lines += tables.fp8_line(suite)
    lines += tables.suite_section(suite)
    lines += tables.time_section(suite)
    if part in (None, 1):
        lines += tables.anchors_section(suite, data["matmul"], name)
        lines += tables.plain_loop_section(data["overhead"], suite)
    if part in (None, 2):
        lines += tables.explain_section(suite)
        lines += tables.fidelity_section(data["fidelity"])
        lines += tables.headroom_section(data["headroom"])
    lines += tables.failure_logs(suite)
    return "\n".join(lines) + "\n"


def _place(text: str, dest: Path, work: Path) -> None:
    """dest whole or not at all: written to a temporary file outside OUT (in the work folder, else
    beside OUT), then renamed over dest; a kill mid-write leaves the previous one and no extra file
    in OUT. Across file systems, where no rename can, it is written in place."""
    for folder in (work, dest.parent.parent):
        tmp = folder / f".{dest.name}.{os.getpid()}.tmp"
        try:
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, dest)
            return
        except OSError:
            tmp.unlink(missing_ok=True)
    dest.write_text(text, encoding="utf-8")


def write_flat(data: dict, out: Path, work: Path, prefix: str = "") -> list[Path]:
    """The part's tables as flat CSVs in OUT (PREFIX + suite.csv, overhead.csv | fidelity.csv,
    headroom.csv; stages.csv)."""
    written = []
    for key in TABLES.get(data.get("part"), ("suite", "overhead", "fidelity", "headroom")):
        if not data[key].empty:
            path = out / f"{prefix}{key}.csv"
            _place(data[key].drop(columns=["run_dir"], errors="ignore").to_csv(index=False), path, work)
            written.append(path)
    _place(pd.DataFrame(data["stages"].values()).to_csv(index=False), out / f"{prefix}stages.csv", work)
    archive = pack_runs(work, out / f"{prefix}{ARCHIVE}")
    return written + [out / f"{prefix}stages.csv"] + ([archive] if archive else [])


def pack_runs(work: Path, dest: Path) -> Path | None:
    """One archive of what the part's runs left that later scoring needs: each run's manifest, plan, tables
    and logs, then its explain traces (already gzipped), smallest first, while the archive stays under
    ARCHIVE_MAX_BYTES; what did not fit is named in its INDEX.txt. Written beside OUT, then renamed in."""
    import tarfile
    folders = run_dirs(work)
    if not folders:
        return None
    first = [f for d in folders for f in sorted(d.glob("*")) if f.is_file() and not f.name.startswith(".")] + \
            [f for d in folders for f in sorted((d / "logs").glob("*.log"))]
    traces = sorted((f for d in folders for f in (d / "traces").glob("*") if f.is_file()),
                    key=lambda f: f.stat().st_size)
    taken, left, size = [], [], 0
    for path in first + traces:
        if size + path.stat().st_size > ARCHIVE_MAX_BYTES:
            left.append(path)
            continue
        taken.append(path)
        size += path.stat().st_size
    index = "\n".join([f"{len(taken)} files, {size} bytes before compression"] +
                      [f"not taken (the archive's {ARCHIVE_MAX_BYTES} bytes): {p.relative_to(work)}" for p in left])
    tmp = work / f".{dest.name}.{os.getpid()}.tmp"
    with tarfile.open(tmp, "w:gz") as archive:
        for path in taken:
            archive.add(path, arcname=str(path.relative_to(work)))
        info = tarfile.TarInfo("INDEX.txt")
        info.size = len(index.encode())
        archive.addfile(info, io.BytesIO(index.encode()))
    shutil.move(tmp, dest)  # a rename where OUT is on the same file system
    return dest


def summarize(work: Path, out: Path, part: int | None = None) -> tuple[str, list[str]]:
    """Read WORK, write OUT/partN_summary.md and the part's CSVs; (verdict, reasons)."""
    data = load(work, part)
    out.mkdir(parents=True, exist_ok=True)
    prefix = f"part{part}_" if part else ""
    write_flat(data, out, work, prefix)
    _place(render(data), out / f"{prefix}summary.md", work)
    return verdict(data)


def matmul_tflops(path: Path, n: int = 8192, repeats: int = 20) -> dict:
    """bf16 n^3 matmul rate on the current GPU (~790 TFLOP/s on an H200: docs/sources.md)."""
    import torch
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(repeats):
        a @ b
    end.record()
    torch.cuda.synchronize()
    seconds = start.elapsed_time(end) / 1e3 / repeats
    result = {"n": n, "dtype": "bfloat16", "seconds": seconds, "tflops": 2 * n**3 / seconds / 1e12,
              "device_name": torch.cuda.get_device_name()}
    path.write_text(json.dumps(result), encoding="utf-8")
    return result


def main(argv: list[str]) -> int:
    if len(argv) >= 3 and argv[0] == "summary":
        part = int(argv[argv.index("--part") + 1]) if "--part" in argv[:-1] else None
        status, reasons = summarize(Path(argv[1]), Path(argv[2]), part)
        if "--final" in argv:
            for reason in reasons:
                print(f"  {reason}")
            print(f"gpu check: {status}")
            return 0 if status.startswith("PASSED") else 1
        return 0
    if len(argv) == 2 and argv[0] == "matmul":
        result = matmul_tflops(Path(argv[1]))
        print(f"bf16 {result['n']}^3 matmul: {result['tflops']:.0f} TFLOP/s on {result['device_name']} "
              "(about 790 on an H200: docs/sources.md)")
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
