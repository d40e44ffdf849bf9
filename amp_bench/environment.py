"""Versions and machine facts recorded next to every result (the fuller record is issue #3's)."""
from __future__ import annotations

import os
import platform
import socket
import sys
from importlib import metadata

RESULT_AFFECTING_ENV = ("CUDA_VISIBLE_DEVICES", "NVIDIA_TF32_OVERRIDE", "OMP_NUM_THREADS",
                        "CUBLAS_WORKSPACE_CONFIG", "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE")


def package_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return ""


def versions() -> dict[str, str]:
    """Library versions; importing torch is needed for its CUDA/cuDNN builds but creates no context."""
    import torch
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {
        "python_version": platform.python_version(),
        "torch_version": torch.__version__,
        "torch_git_version": getattr(torch.version, "git_version", "") or "",
        "torch_cuda_version": torch.version.cuda or "",
        "cudnn_version": str(cudnn) if cudnn else "",
        "torchvision_version": package_version("torchvision"),
        "transformers_version": package_version("transformers"),
        "amp_bench_version": package_version("amp_bench"),
    }


def host_facts() -> dict[str, object]:
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "env": {k: os.environ[k] for k in RESULT_AFFECTING_ENV if k in os.environ},
        "argv": sys.argv,
    }
