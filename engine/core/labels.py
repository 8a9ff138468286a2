"""Node labels: their syntax (Kubernetes'), how ``gangflow node --labels`` writes them, and how a rank sees its
node's.

A node agent carries labels (``gpu=h100,zone=a,capacity=spot``, plus what it detects of its GPUs); flavors and
node selectors match them, topology levels are read from them. Keys and values follow Kubernetes' label syntax,
so a label copied from a Kubernetes node (``nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3``) means the same here:

- key: an optional DNS-subdomain prefix and ``/``, then a name of at most 63 characters, alphanumeric at both
  ends with ``-``, ``_``, ``.`` inside (``gpu``, ``gangflow.io/gpu.product``);
- value: empty, or at most 63 characters of the same kind as a name.

Pure: the authoring layer (``Resources(node_selector=...)``) and the node agent both check with it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

__all__ = [
    "NODE_ID_ENV",
    "NODE_LABELS_ENV",
    "check_label",
    "check_label_key",
    "check_name",
    "format_labels",
    "node_env",
    "parse_labels",
]

#: the rank environment's name of the node a rank runs on (as Slurm's ``SLURMD_NODENAME``)
NODE_ID_ENV = "GANGFLOW_NODE_ID"
#: the rank environment's labels of that node: ``k=v`` pairs, comma-separated, sorted by key
NODE_LABELS_ENV = "GANGFLOW_NODE_LABELS"

_NAME = re.compile(r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_DNS_LABEL = r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?"
_PREFIX = re.compile(rf"{_DNS_LABEL}(?:\.{_DNS_LABEL})*")

_NAME_RULE = "at most 63 characters, letters, digits, '-', '_' or '.', beginning and ending with a letter or digit"


def check_name(name: object, what: str) -> str:
    """``name`` when it is a Kubernetes name (a label's name part, a label value, a flavor), else ValueError."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"{what} {name!r} is not a valid name: {_NAME_RULE}")
    return name


def check_label_key(key: object, what: str = "label key") -> str:
    """``key`` when it is a Kubernetes label key (``[prefix/]name``), else ValueError naming the rule."""
    if not isinstance(key, str):
        raise ValueError(f"{what} {key!r} is not a string")
    prefix, slash, name = key.rpartition("/")
    if slash and (len(prefix) > 253 or not _PREFIX.fullmatch(prefix)):
        raise ValueError(
            f"{what} {key!r}: its prefix {prefix!r} is not a DNS subdomain (lowercase letters, digits, '-' and "
            "'.', at most 253 characters, e.g. 'gangflow.io/gpu.product')"
        )
    check_name(name, f"{what} {key!r}: the name")
    return key


def check_label(key: object, value: object) -> tuple[str, str]:
    """(key, value) when both follow Kubernetes' label syntax, else ValueError naming which one does not."""
    check_label_key(key)
    if not isinstance(value, str):
        raise ValueError(f"label {key}: its value {value!r} is not a string")
    if value:  # an empty value is a valid label value (Kubernetes' too)
        check_name(value, f"label {key}: the value")
    return str(key), value


def parse_labels(text: str, what: str = "--labels") -> dict[str, str]:
    """``gpu=h100,zone=a`` as a dict; ValueError naming ``what`` and the item at fault (no ``=``, an empty
    item, a key given twice, a key or value against Kubernetes' label syntax)."""
    labels: dict[str, str] = {}
    for item in text.split(","):
        item = item.strip()
        if not item:
            raise ValueError(f"{what} {text!r}: an empty item (write key=value pairs separated by commas)")
        key, eq, value = item.partition("=")
        if not eq:
            raise ValueError(f"{what} {text!r}: {item!r} is not key=value")
        key, value = key.strip(), value.strip()
        if key in labels:
            raise ValueError(f"{what} {text!r}: label {key!r} is given twice")
        try:
            check_label(key, value)
        except ValueError as exc:
            raise ValueError(f"{what}: {exc}") from None
        labels[key] = value
    return labels


def format_labels(labels: Mapping[str, str]) -> str:
    """``k=v`` pairs sorted by key, comma-separated: what ``GANGFLOW_NODE_LABELS`` holds and
    ``parse_labels`` reads back."""
    return ",".join(f"{k}={labels[k]}" for k in sorted(labels))


def node_env(node_id: str, labels: Mapping[str, str]) -> dict[str, str]:
    """The rank environment's variables that name the rank's node and its labels."""
    return {NODE_ID_ENV: node_id, NODE_LABELS_ENV: format_labels(labels)}
