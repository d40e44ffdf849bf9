"""The machine fingerprint every result row carries: which host, GPU, driver, CUDA and torch produced
it. Rows with different fingerprints are different series (history, nightly) and are not compared
(compare refuses them unless --force). Written by every run directory's writer: a study's session,
and `ingest` for pytest-benchmark files."""
from __future__ import annotations

import os


def fingerprint_columns(device: dict, versions: dict, gpu: dict, hostname: str,
                        cpu_count: int | None = None) -> dict[str, object]:
    """Columns on every result row that say which machine and software produced it; `fingerprint`
    hashes the parts that make two results comparable as one series."""
    import hashlib
    capability = device.get("capability")
    columns = {
        "gpu_uuid": gpu.get("gpu_uuid") or device.get("uuid") or "",  # NVML's, else torch's
        "driver_version": gpu.get("driver_version") or "",
        "compute_capability": f"{capability[0]}.{capability[1]}" if capability else "",
        "gpu_memory_bytes": device.get("total_memory_bytes"),
        "cpu_model": device.get("cpu_model", ""),
        "cpu_count": cpu_count or os.cpu_count(),
        "cpu_bf16_isa": ",".join(f for f in sorted(device.get("cpu_flags") or ())
                                 if f in ("avx512_bf16", "amx_bf16", "avx512_fp16", "amx_fp16")) or "none",
    }
    identity = [hostname, device.get("name", ""), columns["gpu_uuid"] or columns["cpu_model"],
                columns["driver_version"], versions.get("torch_cuda_version", ""), versions.get("torch_version", "")]
    columns["fingerprint"] = hashlib.sha256("|".join(map(str, identity)).encode()).hexdigest()[:12]
    return columns


def fingerprints(results) -> set[str]:
    """The machine fingerprints a results table carries."""
    return set() if "fingerprint" not in results else set(results["fingerprint"].dropna().astype(str))


def fingerprint_mismatch(base_rows, cand_rows) -> tuple[bool, str]:
    """(the two sides come from different machines or software, what to say about it): compare
    refuses such sides unless told to go on; results without a fingerprint are said to be unchecked."""
    base_fp, cand_fp = fingerprints(base_rows), fingerprints(cand_rows)
    if base_fp and cand_fp and base_fp != cand_fp:
        return True, (f"machine fingerprints differ (baseline {', '.join(sorted(base_fp))}, candidate "
                      f"{', '.join(sorted(cand_fp))}): different hardware or software")
    if not base_fp or not cand_fp:
        return False, ("results without a machine fingerprint: could not check they come from the same machine and "
                       "software")
    return False, ""
