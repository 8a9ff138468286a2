"""GPU detection for a node agent."""

from __future__ import annotations

import shutil
import subprocess

__all__ = ["detect_gpus"]


def detect_gpus() -> int:
    """Number of NVIDIA GPUs ``nvidia-smi`` reports, 0 when there is none or no driver."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return 0
    try:
        out = subprocess.run(
            [smi, "--query-gpu=index", "--format=csv,noheader"], capture_output=True, text=True, timeout=20, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.splitlines() if line.strip().isdigit())
