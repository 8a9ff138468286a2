"""GPU detection for a node agent: how many GPUs, and the labels that name them.

A node agent labels its node with what ``nvidia-smi`` reports (``gangflow node`` adds them to ``--labels``; a
label given there wins over a detected one of the same key). The names follow NVIDIA's GPU feature discovery
(``nvidia.com/gpu.product``, ``nvidia.com/gpu.memory``, ``nvidia.com/gpu.count``), with gangflow's own prefix:
a selector written for a Kubernetes node that GFD labelled reads the same here once its prefix is changed, and
the ``nvidia.com/`` prefix stays GFD's own (its labels carry more than these three, which gangflow does not
detect, and a cluster may run both). Values as GFD writes them: the product with spaces as ``-``
(``NVIDIA-H100-80GB-HBM3``), memory in MiB (``81559``).
"""

from __future__ import annotations

import re
import shutil
import subprocess

from engine.core.labels import parse_labels

__all__ = ["GPU_COUNT_LABEL", "GPU_MEMORY_LABEL", "GPU_PRODUCT_LABEL", "detect_gpus", "gpu_labels", "node_labels"]

#: the GPU model, as nvidia-smi names it (``NVIDIA-H100-80GB-HBM3``)
GPU_PRODUCT_LABEL = "gangflow.io/gpu.product"
#: each GPU's memory in MiB (``81559``)
GPU_MEMORY_LABEL = "gangflow.io/gpu.memory"
#: how many GPUs nvidia-smi reports
GPU_COUNT_LABEL = "gangflow.io/gpu.count"


def _smi(query: str) -> str | None:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        return subprocess.run(
            [smi, f"--query-gpu={query}", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def detect_gpus() -> int:
    """Number of NVIDIA GPUs ``nvidia-smi`` reports, 0 when there is none or no driver."""
    out = _smi("index")
    return 0 if out is None else sum(1 for line in out.splitlines() if line.strip().isdigit())


def _label_value(text: str) -> str:
    """``text`` as a label value: runs of other characters as ``-``, alphanumeric ends, at most 63 characters."""
    value = re.sub(r"[^A-Za-z0-9_.]+", "-", text.strip())[:63]
    return re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", value)


def gpu_labels(csv: str) -> dict[str, str]:
    """The labels of ``nvidia-smi --query-gpu=name,memory.total --format=csv,noheader`` output (one line per GPU,
    ``NVIDIA H100 80GB HBM3, 81559 MiB``): the first GPU's product and memory (a node's GPUs are one model; GFD
    labels it so too), and the count. Nothing for no GPU."""
    rows = [[cell.strip() for cell in line.split(",")] for line in csv.splitlines() if line.strip()]
    if not rows:
        return {}
    labels = {GPU_COUNT_LABEL: str(len(rows))}
    product = _label_value(rows[0][0])
    if product:
        labels[GPU_PRODUCT_LABEL] = product
    memory = re.match(r"\d+", rows[0][1]) if len(rows[0]) > 1 else None
    if memory:
        labels[GPU_MEMORY_LABEL] = memory[0]
    return labels


def node_labels(given: str | None, *, detect: bool = True) -> dict[str, str]:
    """A node agent's labels: ``given`` (``gpu=h100,zone=a``, checked first: ValueError naming what is wrong)
    over what ``nvidia-smi`` reports where present."""
    own = parse_labels(given) if given else {}
    out = _smi("name,memory.total") if detect else None
    return {**(gpu_labels(out) if out else {}), **own}
