"""amp_bench's trace reader side by side with Holistic Trace Analysis (HTA) on real GPU traces.

HTA is not a dependency (0.5.0 pulls JupyterLab and ~80 packages), so this runs in a venv of its own:

    python -m venv /tmp/hta_venv && /tmp/hta_venv/bin/pip install HolisticTraceAnalysis==0.5.0
    /tmp/hta_venv/bin/python benchmarks/hta_cross_check.py TRACE.json.gz [...] [--json OUT.json]

(with no traces: the committed fixtures under tests/data/hta/). For each trace it prints HTA's
`get_gpu_kernel_breakdown(include_memory_kernels=True)` kernel-type totals and `get_temporal_breakdown`
idle time beside amp_bench's, and the difference. HTA reports overlapping stretches as rows of their
own ("COMPUTATION overlapping COMMUNICATION"); a kind's busy time is the sum of every row that names it,
which is what amp_bench computes (the union of that kind's kernels). A trace without
`distributedInfo.rank` gets `{"rank": 0}` added in a temporary copy (HTA needs it: its issue #16).
`--json` writes the figures tests/test_explain_traces.py holds amp_bench to.
"""
from __future__ import annotations

import argparse
import gzip
import json
import logging
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
FIXTURES = ROOT / "tests" / "data" / "hta"
KINDS = ("COMPUTATION", "COMMUNICATION", "MEMORY")


def hta_figures(trace: Path) -> dict:
    """HTA's per-kind busy time (ms; rows mapped to kinds) and idle time (ms) of one trace."""
    from hta.trace_analysis import TraceAnalysis
    logging.getLogger("hta").setLevel(logging.ERROR)
    workdir = Path(tempfile.mkdtemp(prefix="hta_check_"))
    try:
        with gzip.open(trace, "rt") if trace.suffix == ".gz" else open(trace) as fh:
            content = json.load(fh)
        if not isinstance(content.get("distributedInfo"), dict) or "rank" not in content["distributedInfo"]:
            content["distributedInfo"] = {"rank": 0}
        copy = workdir / "rank-0.json.gz"
        with gzip.open(copy, "wt") as fh:
            json.dump(content, fh)
        analysis = TraceAnalysis(trace_dir=str(workdir))
        kernel_types, _ = analysis.get_gpu_kernel_breakdown(visualize=False, include_memory_kernels=True)
        temporal = analysis.get_temporal_breakdown(visualize=False)
        from hta.utils.utils import get_kernel_type
        frame, symbols = analysis.t.get_trace(analysis.t.get_ranks()[0]), analysis.t.symbol_table.get_sym_table()
        gpu = frame[frame["stream"].ne(-1) & frame["name"].map(lambda i: get_kernel_type(symbols[i]) in KINDS)]
        category = gpu["cat"].map(lambda i: symbols[i])
        # HTA also counts some cuda_sync markers ("Stream Wait Event") as computation; amp_bench
        # counts kernels, memcpys and memsets only: the two counts are given apart
        # older traces name them Kernel, Memcpy and Memset (HTA reads both spellings, as amp_bench does)
        events = int(category.isin(["kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset"]).sum())
        syncs = int(category.eq("cuda_sync").sum())
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    rows = {str(r["kernel_type"]): float(r["sum"]) / 1e3 for _, r in kernel_types.iterrows()}
    kinds = {k.lower(): sum(v for name, v in rows.items() if k in name.split(" overlapping ")) for k in KINDS}
    return {"rows_ms": rows, "kinds_ms": kinds, "events": events, "sync_events": syncs,
            "idle_ms": float(temporal["idle_time(us)"].iloc[0]) / 1e3,
            "span_ms": float(temporal["kernel_time(us)"].iloc[0]) / 1e3}


def amp_bench_figures(trace) -> dict:
    from amp_bench.analysis.explain.trace import read_profile
    profile = read_profile(trace, "cuda")
    tc = profile.tensor_cores or {}
    return {"kinds_ms": profile.kinds_ms, "idle_ms": profile.gpu_idle_ms, "span_ms": profile.gpu_span_ms,
            "device": profile.device_name, "tensor_core_share": tc.get("share"),
            "tensor_core_unknown_ms": tc.get("unknown_ms"), "steps": len(profile.steps), "events": profile.gpu_events}


def _diff(ours: float, theirs: float) -> str:
    return "   -  " if not theirs else f"{(ours - theirs) / theirs:+.2%}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("traces", nargs="*", type=Path)
    parser.add_argument("--json", type=Path, help="write every figure here")
    args = parser.parse_args(argv)
    traces = args.traces or sorted(FIXTURES.glob("*.json.gz"))
    out = {}
    for trace in traces:
        hta, ours = hta_figures(trace), amp_bench_figures(trace)
        out[trace.name] = {"hta": hta, "amp_bench": ours}
        share = ours["tensor_core_share"]
        print(f"== {trace.name} ({ours['device'] or 'no device name'}; {ours['steps']} steps; Tensor Core share of "
              f"GEMM+conv {'-' if share is None else f'{share:.0%}'})")
        for kind in (k.lower() for k in KINDS):
            print(f"  {kind:14s} HTA {hta['kinds_ms'][kind]:10.3f} ms   amp_bench {ours['kinds_ms'][kind]:10.3f} ms  "
                  f"{_diff(ours['kinds_ms'][kind], hta['kinds_ms'][kind])}")
        print(f"  {'idle':14s} HTA {hta['idle_ms']:10.3f} ms   amp_bench {ours['idle_ms']:10.3f} ms  "
              f"{_diff(ours['idle_ms'], hta['idle_ms'])}")
        print(f"  kernels, memcpys and memsets counted: HTA {hta['events']} "
              f"(and {hta['sync_events']} cuda_sync markers), "
              f"amp_bench {ours['events']}")
        print("  HTA rows:", {k: round(v, 3) for k, v in hta["rows_ms"].items()})
    if args.json:
        args.json.write_text(json.dumps(out, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
