"""The GPU-flavor workload of ``bench_scheduler.py --flavors h100:400,a100:600`` (nodes per flavor).

The trace is the default one (``generate_workload``) on as many nodes as the flavors add up to; on top of it:

* the nodes carry ``gpu=<flavor>`` labels: the first 400 h100, the next 600 a100 (in node id order);
* the queue file declares one flavor per name (``node_labels: {gpu: <name>}``) and splits each tenant's GPU
  quota and borrowing limit between the flavors in proportion to their nodes (the last flavor gets the
  rounding), in the flag's order, which is each tenant's order of preference;
* each gang asks, seeded: half of them one flavor (drawn in proportion to the nodes), the other half any of
  two (both, in a random order).

``flavor_violations`` counts the admissions that break the flavor rules: a node of another flavor than the
ones the gang asked for, nodes of two flavors in one gang, or (the Policy) an ``Admitted.flavor`` that is not
its nodes'. The FIFO baseline knows no flavors: its count says what flavor-blind placement does.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Fleet", "parse_flavors"]


def parse_flavors(text: str) -> list[tuple[str, int]]:
    """``h100:400,a100:600`` -> [("h100", 400), ("a100", 600)]; ValueError naming what is wrong."""
    out: list[tuple[str, int]] = []
    for part in text.split(","):
        name, _, count = part.strip().partition(":")
        if not name or not count.isdigit() or int(count) <= 0:
            raise ValueError(f"--flavors: {part!r} is not NAME:NODES with NODES > 0 (e.g. h100:400,a100:600)")
        if name in (n for n, _ in out):
            raise ValueError(f"--flavors: flavor {name!r} is named twice")
        out.append((name, int(count)))
    return out


@dataclass
class Fleet:
    """The flavors of one run: node labels, each gang's flavors, and the violations seen so far."""

    flavors: list[tuple[str, int]]
    node_flavor: dict[str, str] = field(default_factory=dict)
    gang_flavors: dict[str, tuple[str, ...]] = field(default_factory=dict)
    violations: dict[str, int] = field(default_factory=dict)  # per adapter name
    examples: list[str] = field(default_factory=list)

    @property
    def nodes(self) -> int:
        return sum(n for _, n in self.flavors)

    def label(self, node_ids: list[str], gang_ids: list[str], seed: int) -> None:
        """Give the nodes their flavors and draw each gang's."""
        at = 0
        for name, count in self.flavors:
            for node_id in node_ids[at : at + count]:
                self.node_flavor[node_id] = name
            at += count
        rng = random.Random(f"flavors-{seed}")
        names = [n for n, _ in self.flavors]
        weights = [c for _, c in self.flavors]
        for gang_id in gang_ids:
            if len(names) > 1 and rng.random() < 0.5:
                self.gang_flavors[gang_id] = tuple(rng.sample(names, 2))
            else:
                self.gang_flavors[gang_id] = (rng.choices(names, weights)[0],)

    def queue(self, queue: dict[str, Any]) -> dict[str, Any]:
        """The queue file with flavors and the tenants' GPU quotas and borrowing limits split per flavor."""
        total = self.nodes

        def split(gpus: int) -> dict[str, dict[str, int]]:
            parts, left = {}, gpus
            for i, (name, count) in enumerate(self.flavors):
                share = left if i == len(self.flavors) - 1 else round(gpus * count / total)
                parts[name] = {"gpu": share}
                left -= share
            return parts

        tenants = []
        for tenant in queue["tenants"]:
            entry = dict(tenant)
            entry["quota"] = split(int(tenant["quota"]["gpu"]))
            if "borrowing_limit" in tenant:
                entry["borrowing_limit"] = split(int(tenant["borrowing_limit"]["gpu"]))
            tenants.append(entry)
        flavors = [{"name": name, "node_labels": {"gpu": name}} for name, _ in self.flavors]
        return {**queue, "flavors": flavors, "tenants": tenants}

    def labels(self, node_id: str) -> dict[str, str]:
        flavor = self.node_flavor.get(node_id)
        return {} if flavor is None else {"gpu": flavor}

    def check(self, adapter: str, gang_id: str, node_ids: list[str], flavor: str | None) -> None:
        """Count an admission that breaks the flavor rules (module docstring)."""
        on = {self.node_flavor.get(n) for n in node_ids}
        asked = self.gang_flavors.get(gang_id, ())
        wrong = len(on) != 1 or not on <= set(asked) or (flavor is not None and on != {flavor})
        self.violations.setdefault(adapter, 0)
        if wrong:
            self.violations[adapter] += 1
            if len(self.examples) < 5:
                self.examples.append(f"{adapter}: {gang_id} asked {asked}, got {sorted(map(str, on))} ({flavor})")
