"""Finding plugins by name: the entry-point group ``gangflow.plugins``.

gangflow's own plugins (pytorch, jax, xgboost, mpi) are registered there by its package metadata, and
a third-party package adds its own the same way:

    [project.entry-points."gangflow.plugins"]
    ray = "gangflow_ray:Ray"

    @task(plugin=plugin("ray", nnodes=2))
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

from engine.errors import DefinitionError

__all__ = ["GROUP", "available_plugins", "load_plugin", "plugin"]

GROUP = "gangflow.plugins"


def available_plugins() -> dict[str, str]:
    """Plugin name → ``module:Class`` of every installed plugin."""
    return {ep.name: ep.value for ep in sorted(entry_points(group=GROUP), key=lambda e: e.name)}


def load_plugin(name: str) -> Any:
    """The plugin's config class, e.g. ``load_plugin("jax")`` is ``plugins.jax.Jax``."""
    found = [ep for ep in entry_points(group=GROUP) if ep.name == name]
    if not found:
        known = ", ".join(available_plugins()) or "none"
        raise DefinitionError(f"no gangflow plugin named {name!r} is installed (installed: {known})")
    return found[0].load()


def plugin(name: str, **options: Any) -> Any:
    """A plugin config by name: ``plugin("pytorch", nnodes=2, nproc_per_node=4)``."""
    return load_plugin(name)(**options)
