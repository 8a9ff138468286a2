"""Plugins are found by name through the entry-point group ``gangflow.plugins``."""

from __future__ import annotations

import importlib.metadata
import sys

import pytest

from engine import DefinitionError, available_plugins, plugin, task
from engine.core import definition_of
from plugins.pytorch import PyTorch


def test_built_in_plugins_are_registered():
    assert {"pytorch", "jax", "xgboost", "mpi"} <= set(available_plugins())
    assert plugin("pytorch", nnodes=2, nproc_per_node=4) == PyTorch(nnodes=2, nproc_per_node=4)


def test_a_third_party_package_adds_its_own(tmp_path, monkeypatch):
    (tmp_path / "acme_plugin.py").write_text(
        "from dataclasses import dataclass\n"
        "from engine import GangPlugin\n"
        "@dataclass(frozen=True)\n"
        "class Acme(GangPlugin):\n"
        "    '''Acme's trainer.'''\n"
        "    nnodes: int = 1\n"
        "    nproc_per_node: int = 1\n"
        "    def rank_env(self, rank):\n"
        "        return {'ACME_RANK': str(rank.rank)}\n"
    )
    dist = tmp_path / "acme_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[gangflow.plugins]\nacme = acme_plugin:Acme\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    assert available_plugins()["acme"] == "acme_plugin:Acme"

    @task(plugin=plugin("acme", nnodes=3))
    def train() -> None: ...

    assert definition_of(train).gang.nnodes == 3
    sys.modules.pop("acme_plugin", None)


def test_unknown_plugin_names_the_installed_ones():
    with pytest.raises(DefinitionError, match=r"no gangflow plugin named 'ray' is installed .*pytorch"):
        plugin("ray")


def test_plugin_options_are_validated():
    from plugins.mpi import MPI
    from plugins.xgboost import XGBoost

    with pytest.raises(ValueError, match="backend must be one of"):
        PyTorch(backend="mpi")
    with pytest.raises(ValueError, match="multiple of workers_per_node"):
        XGBoost(n_workers=3, workers_per_node=2)
    with pytest.raises(ValueError, match="'openmpi' is not supported"):
        MPI(implementation="openmpi")
    from engine import Resources

    def train() -> None: ...

    with pytest.raises(DefinitionError, match=r"resources\.gpu=3 is per node and must split evenly"):
        task(plugin=PyTorch(nproc_per_node=2), resources=Resources(gpu=3))(train)
