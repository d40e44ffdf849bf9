"""The GPU check's summary (scripts/gpu_check.sh): one markdown page and a few flat CSVs that are
complete whenever the check stops, and the verdict that can't pass by accident.

The script runs its stages into a work folder and, after each, calls

    python3 -m amp_bench.gpu_check summary WORK OUT [--final]

which reads what the stages left (WORK/stages.tsv, WORK/env.json, WORK/matmul.json, the run
directories under WORK/suite, WORK/fidelity, WORK/headroom, WORK/overhead.csv), copies the tables
flat into OUT (at most 8 files come back from a remote GPU machine) and writes OUT/summary.md:
our figures beside the published anchors (shared/FIELD_NOTES.md) and beside a plain hand-written
AMP loop run in the same call. `--final` prints the verdict and exits 1 unless it passed.
`python3 -m amp_bench.gpu_check matmul FILE` measures the bf16 dense matmul rate (GPU only).
Torch-free at import; no plotly, no scikit-learn.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

from amp_bench.gpu_check import tables

STAGES = ("env", "pytest", "suite", "overhead", "fidelity", "headroom")
FINISHED = ("ok", "failed", "timeout", "skipped", "budget")  # a stage's last word; "pending" until then


def read_stages(path: Path) -> dict[str, dict]:
    """stage -> its latest line in stages.tsv (name, status, seconds, timeout, note)."""
    stages = {name: {"stage": name, "status": "pending", "seconds": "", "timeout": "", "note": ""} for name in STAGES}
    if path.is_file():
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            parts = (line.split("\t") + [""] * 5)[:5]
            if parts[0]:
                stages[parts[0]] = dict(zip(("stage", "status", "seconds", "timeout", "note"), parts))
    return stages


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _run_dirs(folder: Path, table: str) -> list[Path]:
    return sorted(p.parent for p in folder.rglob(f"{table}.csv")) if folder.is_dir() else []


def _read(folder: Path, table: str) -> pd.DataFrame:
    frames = []
    for run_dir in _run_dirs(folder, table):
        try:
            frame = pd.read_csv(run_dir / f"{table}.csv")
        except (ValueError, pd.errors.ParserError, OSError):
            continue
        if not frame.empty:
            frame["run_dir"] = str(run_dir)
            frames.append(frame)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def load(work: Path) -> dict:
    """Everything the stages left in the work folder (empty frames / dicts where a stage left nothing)."""
    overhead = pd.DataFrame()
    if (work / "overhead.csv").is_file():
        try:
            overhead = pd.read_csv(work / "overhead.csv")
        except (ValueError, pd.errors.ParserError):
            pass
    return {"stages": read_stages(work / "stages.tsv"), "env": _read_json(work / "env.json"),
            "matmul": _read_json(work / "matmul.json"), "suite": _read(work / "suite", "results"),
            "fidelity": _read(work / "fidelity", "fidelity"), "headroom": _read(work / "headroom", "headroom"),
            "overhead": overhead}


def capability(data: dict) -> tuple[int, int] | None:
    device = (data["env"].get("device") or {})
    cap = device.get("capability")
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
    any fidelity or headroom row not ok."""
    from amp_bench.fidelity import failed_rows as fidelity_failed
    from amp_bench.headroom import failed_rows as headroom_failed
    out = [f"stage {s['stage']}: {s['status']}" + (f" ({s['note']})" if s["note"] else "")
           for s in data["stages"].values() if s["status"] in ("failed", "timeout")]
    suite, cap = data["suite"], capability(data)
    if not suite.empty:
        for _, row in suite[suite["status"] != "ok"].iterrows():
            if row["status"] == "unsupported" and not _required(row.get("precision"), cap):
                continue
            reason = str(row.get("reason") or "").splitlines()[0][:200] if isinstance(row.get("reason"), str) else ""
            out.append(f"suite {row['case_id']}: {row['status']}" + (f" ({reason})" if reason else ""))
    if not data["fidelity"].empty:
        out += [f"fidelity {line}" for line in fidelity_failed(data["fidelity"], allow_unsupported=False)]
    if not data["headroom"].empty:
        out += [f"headroom {line}" for line in headroom_failed(data["headroom"], allow_unsupported=False)]
    return out


def _required(precision, cap) -> bool:
    """Must this precision run on a GPU of this capability? Modes that are emulated below their
    capability (bf16, fp16) are required from 8.0, like the check always asked."""
    from amp_bench import modes
    if cap is None or precision not in modes.names():
        return False
    return cap >= max(modes.get(precision).cuda_min_capability, (8, 0))


def verdict(data: dict) -> tuple[str, list[str]]:
    """PASSED, FAILED or INCOMPLETE (a stage never ran or was cut by the budget), with the reasons."""
    failed = failures(data)
    if failed:
        return "FAILED", failed
    unfinished = [f"stage {s['stage']}: {'cut by the budget' if s['status'] == 'budget' else 'not finished'}"
                  + (f" ({s['note']})" if s["note"] else "")
                  for s in data["stages"].values() if s["status"] in ("pending", "budget")]
    if unfinished:
        return "INCOMPLETE", unfinished
    on_cpu = (data["env"].get("device") or {}).get("type") == "cpu" or \
        (not data["suite"].empty and (data["suite"]["device"] == "cpu").all())
    return ("PASSED (CPU smoke only: no GPU, nothing validated on CUDA)" if on_cpu else "PASSED"), []


# --------------------------------------------------------------------------- the page

def render(data: dict) -> str:
    status, reasons = verdict(data)
    env, suite = data["env"], data["suite"]
    device = env.get("device") or {}
    name = device.get("name") or (suite["device_name"].dropna().iloc[0] if not suite.empty else "unknown device")
    cap = capability(data)
    lines = ["# amp_bench GPU check", "",
             f"**{status}** on {name}" + (f" (compute capability {cap[0]}.{cap[1]})" if cap else "") + ".", ""]
    lines += [f"- {r}" for r in reasons] + ([""] if reasons else [])
    if device.get("type") == "cpu" or (not cap and not suite.empty and (suite["device"] == "cpu").all()):
        lines += ["No CUDA GPU: this run is the CPU smoke of the script's path; nothing here validates CUDA.", ""]
    lines += ["## Stages", "", tables.markdown(pd.DataFrame(data["stages"].values())), ""]
    lines += tables.environment(env)
    lines += tables.suite_section(suite)
    lines += tables.anchors_section(suite, data["matmul"], name)
    lines += tables.plain_loop_section(data["overhead"], suite)
    lines += tables.fidelity_section(data["fidelity"])
    lines += tables.headroom_section(data["headroom"])
    lines += tables.failure_logs(suite)
    return "\n".join(lines) + "\n"


def write_flat(data: dict, out: Path) -> list[Path]:
    """The tables as flat CSVs in OUT (suite.csv, fidelity.csv, headroom.csv, overhead.csv, stages.csv)."""
    written = []
    for key, file in (("suite", "suite.csv"), ("fidelity", "fidelity.csv"), ("headroom", "headroom.csv"),
                      ("overhead", "overhead.csv")):
        frame = data[key]
        if not frame.empty:
            frame.drop(columns=["run_dir"], errors="ignore").to_csv(out / file, index=False)
            written.append(out / file)
    pd.DataFrame(data["stages"].values()).to_csv(out / "stages.csv", index=False)
    return written + [out / "stages.csv"]


def summarize(work: Path, out: Path) -> tuple[str, list[str]]:
    data = load(work)
    out.mkdir(parents=True, exist_ok=True)
    write_flat(data, out)
    tmp = out / ".summary.md.tmp"
    tmp.write_text(render(data), encoding="utf-8")
    tmp.replace(out / "summary.md")  # whole or not at all: a kill mid-write leaves the previous one
    return verdict(data)


def matmul_tflops(path: Path, n: int = 8192, repeats: int = 20) -> dict:
    """bf16 n^3 matmul rate on the current GPU (FIELD_NOTES: ~790 TFLOP/s on an H200)."""
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
        status, reasons = summarize(Path(argv[1]), Path(argv[2]))
        if "--final" in argv:
            for reason in reasons:
                print(f"  {reason}")
            print(f"gpu check: {status}")
            return 0 if status.startswith("PASSED") else 1
        return 0
    if len(argv) == 2 and argv[0] == "matmul":
        result = matmul_tflops(Path(argv[1]))
        print(f"bf16 {result['n']}^3 matmul: {result['tflops']:.0f} TFLOP/s on {result['device_name']} "
              "(FIELD_NOTES: ~790 on an H200)")
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
