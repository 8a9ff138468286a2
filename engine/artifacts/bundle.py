"""Code bundles: the user's workflow file and the package or folder it belongs to, packed as one
reproducible zip and stored by content hash, so a run executes, retries and replays with exactly the
code it started with (DESIGN.md, "Code").

What is packed: if the file sits in a package (a folder with ``__init__.py``), the whole top-level
package; otherwise the whole folder holding the file. Every file goes in, not only ``.py`` files, so the
configs and small data files a task or a ``script=`` reads (``Path(__file__).parent / "config.json"``)
travel with the code. Left out: hidden files and folders (``.git``, ``.env``: secrets must not end up
in the artifact store), virtual environments (any folder holding a ``pyvenv.cfg``), a ``gangflow dev`` state
folder (any holding :data:`DEV_STATE_MARK`: every run's history, the agents' logs and the artifact store, which
would otherwise travel with the code when ``--state-dir`` is inside the project, and make each bundle new), caches
and build outputs (:data:`SKIP_DIRS`), compiled ``.pyc`` files, anything that is not a regular file (a FIFO would
block the read), and what the ``.gangflowignore`` file at the bundle root lists (gitignore-like lines).

Two caps keep a mistake cheap: at most :data:`MAX_BUNDLE_FILES` files are walked (``gangflow run`` from
a home directory fails in a fraction of a second instead of zipping the disk) and the files may total
:data:`MAX_BUNDLE_BYTES`; both refuse with an :class:`~engine.errors.InputError` before anything starts.
"""

from __future__ import annotations

import fnmatch
import io
import os
import stat
import zipfile
from dataclasses import dataclass
from pathlib import Path

from engine.errors import InputError

__all__ = [
    "DEV_STATE_MARK",
    "EXECUTABLE",
    "IGNORE_FILE",
    "MAX_BUNDLE_BYTES",
    "MAX_BUNDLE_FILES",
    "REGULAR",
    "SKIP_DIRS",
    "CodeBundle",
    "pack_code",
]

#: gitignore-like patterns of files and folders to leave out, read from the bundle root
IGNORE_FILE = ".gangflowignore"
#: folder names never packed (hidden folders and virtual environments are left out as well)
SKIP_DIRS = frozenset({"__pycache__", "node_modules", "venv", "site-packages", "build", "dist"})
#: the file that makes a folder a ``gangflow dev`` state folder (Temporal's database), never packed
DEV_STATE_MARK = "temporal.sqlite"
_SKIP_SUFFIXES = (".pyc", ".pyo")
_MB = 1024 * 1024
MAX_BUNDLE_BYTES = 20 * _MB
MAX_BUNDLE_FILES = 10_000
#: the file modes a bundle records (and its extraction restores): executable or not
EXECUTABLE, REGULAR = 0o755, 0o644

_packed: dict[tuple[object, ...], CodeBundle] = {}


@dataclass(frozen=True)
class CodeBundle:
    data: bytes  # the zip
    module: str  # the entry module's dotted name inside the bundle
    root: Path  # the folder the bundle is relative to


@dataclass(frozen=True)
class _Rule:
    pattern: str
    negate: bool
    dir_only: bool
    anchored: bool  # matched against the path from the bundle root, not against the name alone
    any_depth: bool  # a leading ``**/``: the anchored path may start in any folder


class _Ignore:
    """The subset of gitignore a bundle needs: ``#`` comments, ``!`` negation (the last matching line
    wins), a trailing ``/`` for folders only, a leading ``/`` or an inner ``/`` to anchor a pattern at
    the bundle root, ``**/`` for any depth, and fnmatch globs (``*`` also crosses ``/``)."""

    def __init__(self, rules: list[_Rule]) -> None:
        self.rules = rules

    @classmethod
    def read(cls, root: Path) -> _Ignore:
        path = root / IGNORE_FILE
        rules: list[_Rule] = []
        if not path.is_file():
            return cls(rules)
        for raw in path.read_text(errors="replace").splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            negate = line.startswith("!")
            line = line[1:] if negate else line
            dir_only = line.endswith("/")
            line = line.rstrip("/")
            any_depth = line.startswith("**/")
            while line.startswith("**/"):
                line = line[3:]
            anchored = "/" in line
            line = line.lstrip("/")
            if line:
                rules.append(_Rule(line, negate, dir_only, anchored, any_depth))
        return cls(rules)

    def ignored(self, rel: str, *, is_dir: bool) -> bool:
        name = rel.rsplit("/", 1)[-1]
        verdict = False
        for rule in self.rules:
            if rule.dir_only and not is_dir:
                continue
            target = rel if rule.anchored else name
            if fnmatch.fnmatchcase(target, rule.pattern) or (
                rule.any_depth and fnmatch.fnmatchcase(target, "*/" + rule.pattern)
            ):
                verdict = not rule.negate
        return verdict


def _skip_dir(path: Path, name: str) -> bool:
    return (
        name.startswith(".")
        or name in SKIP_DIRS
        or name.endswith(".egg-info")
        or (path / "pyvenv.cfg").exists()  # a virtual environment, whatever its name
        or (path / DEV_STATE_MARK).exists()  # a dev stack's state, whatever its name
    )


def _walk(top: Path, root: Path, ignore: _Ignore) -> list[tuple[Path, os.stat_result]]:
    """The files to pack under ``top`` (paths and their stats), in a deterministic order."""
    found: list[tuple[Path, os.stat_result]] = []
    walked = 0
    for dirpath, dirnames, filenames in os.walk(top):
        here = Path(dirpath)
        dirnames[:] = sorted(
            d
            for d in dirnames
            if not _skip_dir(here / d, d) and not ignore.ignored((here / d).relative_to(root).as_posix(), is_dir=True)
        )
        walked += len(filenames)
        if walked > MAX_BUNDLE_FILES:
            raise InputError(
                f"the code bundle would walk more than {MAX_BUNDLE_FILES} files under {top} (stopped in {here}): "
                f"gangflow packs every file of the workflow's folder. Put the workflow in its own folder or package, "
                f"or list the folders to leave out in {root / IGNORE_FILE} (gitignore-style lines, e.g. `data/`)"
            )
        for name in sorted(filenames):
            if name.startswith(".") or name.endswith(_SKIP_SUFFIXES):
                continue
            path = here / name
            if ignore.ignored(path.relative_to(root).as_posix(), is_dir=False):
                continue
            try:
                info = path.stat()
            except OSError:  # a dangling symlink: nothing to pack
                continue
            if stat.S_ISREG(info.st_mode):
                found.append((path, info))
    return found


def _check_size(file: object, root: Path, files: list[tuple[Path, os.stat_result]]) -> None:
    total = sum(info.st_size for _, info in files)
    if total <= MAX_BUNDLE_BYTES:
        return
    # the few files that make up the bulk (a long tail of small modules would hide them)
    biggest = [item for item in sorted(files, key=lambda item: -item[1].st_size)[:5] if item[1].st_size >= total / 100]
    listing = ", ".join(f"{path.relative_to(root).as_posix()} ({info.st_size / _MB:.1f} MB)" for path, info in biggest)
    raise InputError(
        f"the code bundle of {file} would hold {total / _MB:.1f} MB of files under {root}, more than the "
        f"{MAX_BUNDLE_BYTES / _MB:.0f} MB cap. Biggest: {listing}. List what the run does not need in "
        f"{root / IGNORE_FILE} (gitignore-style lines, e.g. `data/` or `*.ckpt`), or pass large data as "
        "File / Directory inputs"
    )


def pack_code(file: str | os.PathLike[str]) -> CodeBundle:
    """Pack the code a workflow file needs into a deterministic zip. Raises InputError when the bundle
    would be too large (naming the biggest files) or would walk too many files."""
    path = Path(file).resolve()
    if not path.is_file() or path.suffix != ".py":
        raise FileNotFoundError(f"{file}: not a Python file")
    top = path.parent
    while (top / "__init__.py").exists() and (top.parent / "__init__.py").exists():
        top = top.parent
    # Inside a package the bundle is the whole top-level package, relative to the folder holding it;
    # a loose file takes its whole folder along.
    root = top.parent if (top / "__init__.py").exists() else top
    files = _walk(top, root, _Ignore.read(root))
    if not any(f == path for f, _ in files):
        raise InputError(f"{file} is left out of its own code bundle (hidden, or listed in {root / IGNORE_FILE})")
    module = ".".join(path.relative_to(root).with_suffix("").parts)
    # Starting many runs of the same file should not re-read and re-zip it each time: the stat of every
    # file identifies the bundle's content well enough to reuse the last zip.
    key = (str(path), tuple((str(f), info.st_mtime_ns, info.st_size) for f, info in files))
    if key in _packed:
        return _packed[key]
    _check_size(file, root, files)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for f, st in files:
            info = zipfile.ZipInfo(f.relative_to(root).as_posix(), date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            # only "executable or not" is kept (the rest of the mode would make the zip differ between machines):
            # a bundled ./run.sh stays runnable as a rank's command (MPI(command=["./run.sh"]))
            info.external_attr = (EXECUTABLE if st.st_mode & 0o111 else REGULAR) << 16
            archive.writestr(info, f.read_bytes())
    _packed.clear()  # keep only the latest bundle per process: enough for repeated starts
    _packed[key] = CodeBundle(buffer.getvalue(), module, root)
    return _packed[key]
