"""Artifact storage (local directory by default, any fsspec URI) and code bundles."""

from engine.artifacts.bundle import CodeBundle, pack_code
from engine.artifacts.store import ArtifactStore, cache_dir, default_artifact_root

__all__ = ["ArtifactStore", "CodeBundle", "cache_dir", "default_artifact_root", "pack_code"]
