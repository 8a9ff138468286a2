"""Code bundles: the user's workflow file and the package or folder it belongs to, packed as one
reproducible zip and stored by content hash, so a run executes, retries and replays with exactly the
code it started with (DESIGN.md, "Code").

What is packed: if the file sits in a package (a folder with ``__init__.py``), the whole top-level
package; otherwise the folder holding the file (its ``.py`` files and any packages inside it).
Hidden folders, virtual environments and caches are left out.
"""

from __future__ import annotations

import io
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CodeBundle", "pack_code"]

_SKIP_DIRS = {"__pycache__", ".venv", "venv", "node_modules", ".git", ".gangflow", "build", "dist"}
_MAX_BUNDLE_BYTES = 20 * 1024 * 1024
_packed: dict[tuple[object, ...], CodeBundle] = {}


@dataclass(frozen=True)
class CodeBundle:
    data: bytes  # the zip
    module: str  # the entry module's dotted name inside the bundle
    root: Path  # the folder the bundle is relative to


def _package_files(folder: Path, root: Path) -> list[Path]:
    files = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.startswith("."))
        files += [Path(dirpath, f) for f in sorted(filenames) if f.endswith(".py")]
    return files


def pack_code(file: str | os.PathLike[str]) -> CodeBundle:
    """Pack the code a workflow file needs into a deterministic zip."""
    path = Path(file).resolve()
    if not path.is_file() or path.suffix != ".py":
        raise FileNotFoundError(f"{file}: not a Python file")
    top = path.parent
    while (top / "__init__.py").exists() and (top.parent / "__init__.py").exists():
        top = top.parent
    if (top / "__init__.py").exists():  # inside a package: ship the whole top-level package
        root = top.parent
        files = _package_files(top, root)
    else:  # a loose folder: its modules, plus the packages inside it
        root = top
        files = sorted(p for p in root.glob("*.py"))
        for sub in sorted(p for p in root.iterdir() if p.is_dir() and (p / "__init__.py").exists()):
            if sub.name not in _SKIP_DIRS and not sub.name.startswith("."):
                files += _package_files(sub, root)
    module = ".".join(path.relative_to(root).with_suffix("").parts)
    # Starting many runs of the same file should not re-read and re-zip it each time: the stat of every
    # file identifies the bundle's content well enough to reuse the last zip.
    key = (str(path), tuple((str(f), f.stat().st_mtime_ns, f.stat().st_size) for f in files))
    if key in _packed:
        return _packed[key]
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for f in files:
            info = zipfile.ZipInfo(str(f.relative_to(root)), date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, f.read_bytes())
    data = buffer.getvalue()
    if len(data) > _MAX_BUNDLE_BYTES:
        raise ValueError(
            f"the code bundle for {file} is {len(data) / 1e6:.0f} MB: {root} holds too much code; "
            "move the workflow into its own folder or package"
        )
    _packed.clear()  # keep only the latest bundle per process: enough for repeated starts
    _packed[key] = CodeBundle(data, module, root)
    return _packed[key]
