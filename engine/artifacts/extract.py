"""Unpacking the archives a store holds (code bundles are zips, Directory values tars) without trusting them.

An archive comes from a store a tenant writes to, so it is treated as hostile. Before anything is written, the
whole member list is checked: every name must be relative and plain (no absolute path, no drive, no ``..``
component, no NUL), a zip may hold no symlinks, a tar's links must stay inside (``tarfile``'s ``"data"`` filter,
which also drops devices and set-uid bits), and the archive may hold at most :func:`limits`' file count and
declared bytes. While extracting, bytes are counted again (a declared size can lie), and a member that expands
past what it declared, or past the cap, stops the extraction. What is written goes to a staging folder the
caller publishes only when this returns (engine.artifacts.node_cache), so a refused archive leaves nothing a
reader would find.

The caps are per archive and configurable: ``GANGFLOW_EXTRACT_MAX_BYTES`` (default 10 GiB) and
``GANGFLOW_EXTRACT_MAX_FILES`` (default 100,000).
"""

from __future__ import annotations

import hashlib
import os
import stat
import tarfile
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from engine.artifacts.bundle import EXECUTABLE, REGULAR
from engine.errors import GangflowError

__all__ = [
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_FILES",
    "MAX_BYTES_ENV",
    "MAX_FILES_ENV",
    "ArchiveRefused",
    "Limits",
    "extract_tar",
    "extract_zip",
    "limits",
    "plain_name",
    "tar_digests",
    "tree_matches",
    "zip_digests",
]

MAX_BYTES_ENV, MAX_FILES_ENV = "GANGFLOW_EXTRACT_MAX_BYTES", "GANGFLOW_EXTRACT_MAX_FILES"
DEFAULT_MAX_BYTES, DEFAULT_MAX_FILES = 10 * 1024**3, 100_000
_CHUNK = 1 << 20


class ArchiveRefused(GangflowError, ValueError):
    """An archive from a store that gangflow will not unpack (an unsafe name or link, or over a cap). Never
    retried: the same archive is refused again."""

    kind = "ArchiveRefused"


@dataclass(frozen=True)
class Limits:
    max_bytes: int = DEFAULT_MAX_BYTES
    max_files: int = DEFAULT_MAX_FILES


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ArchiveRefused(f"{name}={raw!r} is not a whole number") from None
    if value <= 0:
        raise ArchiveRefused(f"{name}={raw!r} must be positive")
    return value


def limits() -> Limits:
    """The caps in force (read from the environment each time: a test or an operator may change them)."""
    return Limits(_env_int(MAX_BYTES_ENV, DEFAULT_MAX_BYTES), _env_int(MAX_FILES_ENV, DEFAULT_MAX_FILES))


def plain_name(name: str, what: str) -> tuple[str, ...]:
    """The components of a member name that stays inside the folder it is extracted to; ArchiveRefused for an
    absolute name, a drive, a ``..`` component or a NUL."""
    if "\x00" in name or "\\" in name:
        raise ArchiveRefused(f"{what}: refusing the member {name!r}: a NUL or backslash in its name")
    path = PurePosixPath(name)
    if path.is_absolute() or (path.parts and path.parts[0].endswith(":")):
        raise ArchiveRefused(f"{what}: refusing the member {name!r}: an absolute name")
    parts = tuple(p for p in path.parts if p != ".")
    if ".." in parts:
        raise ArchiveRefused(f"{what}: refusing the member {name!r}: a '..' component")
    if not parts:
        raise ArchiveRefused(f"{what}: refusing a member with an empty name")
    return parts


def _check_totals(what: str, files: int, declared: int, cap: Limits) -> None:
    if files > cap.max_files:
        raise ArchiveRefused(f"{what} holds {files} files, more than the {cap.max_files} allowed ({MAX_FILES_ENV})")
    if declared > cap.max_bytes:
        raise ArchiveRefused(
            f"{what} would expand to {declared} bytes, more than the {cap.max_bytes} allowed ({MAX_BYTES_ENV})"
        )


def _zip_members(archive: zipfile.ZipFile, what: str, cap: Limits) -> list[tuple[zipfile.ZipInfo, tuple[str, ...]]]:
    members = []
    for info in archive.infolist():
        parts = plain_name(info.filename, what)
        if stat.S_ISLNK(info.external_attr >> 16):
            raise ArchiveRefused(f"{what}: refusing the member {info.filename!r}: a symlink")
        members.append((info, parts))
    files = [info for info, _ in members if not info.is_dir()]
    _check_totals(what, len(files), sum(info.file_size for info in files), cap)
    return members


def extract_zip(source: Path, staging: Path, what: str) -> dict[str, str]:
    """Extract the zip at ``source`` into the (new) folder ``staging``; returns each file's relative POSIX name
    and sha256. Executables get 0755, other files 0644 (zip keeps no other mode worth keeping)."""
    cap = limits()
    written = 0
    digests: dict[str, str] = {}
    with zipfile.ZipFile(source) as archive:
        members = _zip_members(archive, what, cap)
        staging.mkdir(parents=True, exist_ok=True)
        for info, parts in members:
            dest = staging.joinpath(*parts)
            if info.is_dir():
                dest.mkdir(parents=True, exist_ok=True)
                continue
            digest, size = hashlib.sha256(), 0
            try:
                dest.parent.mkdir(parents=True, exist_ok=True)
                out = open(dest, "xb")  # noqa: SIM115 - closed by the with below; "x": a duplicate name is refused
            except (FileExistsError, NotADirectoryError, IsADirectoryError) as exc:
                raise ArchiveRefused(f"{what}: refusing the member {info.filename!r}: it clashes with another") from exc
            with archive.open(info) as src, out:
                while chunk := src.read(_CHUNK):
                    size += len(chunk)
                    written += len(chunk)
                    if size > info.file_size or written > cap.max_bytes:
                        raise ArchiveRefused(f"{what}: {info.filename!r} expands past its declared size or the cap")
                    digest.update(chunk)
                    out.write(chunk)
            dest.chmod(EXECUTABLE if (info.external_attr >> 16) & 0o111 else REGULAR)
            digests["/".join(parts)] = digest.hexdigest()
    return digests


def zip_digests(source: Path, what: str) -> dict[str, str]:
    """Each file of the zip at ``source`` (relative POSIX name) and the sha256 of its content: what an extracted
    copy must hold."""
    cap = limits()
    digests: dict[str, str] = {}
    with zipfile.ZipFile(source) as archive:
        for info, parts in _zip_members(archive, what, cap):
            if info.is_dir():
                continue
            digest = hashlib.sha256()
            with archive.open(info) as src:
                while chunk := src.read(_CHUNK):
                    digest.update(chunk)
            digests["/".join(parts)] = digest.hexdigest()
    return digests


def _tar_members(tar: tarfile.TarFile, what: str, cap: Limits) -> list[tarfile.TarInfo]:
    members = tar.getmembers()
    for member in members:
        plain_name(member.name, what)
        if member.issym() or member.islnk():
            link = PurePosixPath(member.linkname)
            base = PurePosixPath(member.name).parent if member.issym() else PurePosixPath()
            if link.is_absolute() or ".." in PurePosixPath(os.path.normpath(base / link)).parts:
                raise ArchiveRefused(f"{what}: refusing the link {member.name!r} -> {member.linkname!r}: outside")
        elif not (member.isfile() or member.isdir()):
            raise ArchiveRefused(f"{what}: refusing the member {member.name!r}: not a file, folder or link")
    files = [m for m in members if m.isfile()]
    _check_totals(what, len(members) - sum(m.isdir() for m in members), sum(m.size for m in files), cap)
    return members


def extract_tar(source: Path, staging: Path, what: str) -> None:
    """Extract the tar at ``source`` into the (new) folder ``staging`` (checked first; then tarfile's ``"data"``
    filter, which refuses what the checks would have, as a second line)."""
    cap = limits()
    with tarfile.open(source, "r:") as tar:  # a plain tar, as uploads are: no decompression bomb
        _tar_members(tar, what, cap)
        staging.mkdir(parents=True, exist_ok=True)
        try:
            tar.extractall(staging, filter="data")
        except tarfile.FilterError as exc:
            raise ArchiveRefused(f"{what}: {exc}") from exc


def tar_digests(source: Path, what: str) -> dict[str, str]:
    """What an extracted copy of the tar at ``source`` must hold: each file's relative POSIX name and the sha256
    of its content, each symlink's as ``"-> <target>"``."""
    cap = limits()
    digests: dict[str, str] = {}
    with tarfile.open(source, "r:") as tar:  # a plain tar, as uploads are: no decompression bomb
        members = _tar_members(tar, what, cap)
        by_name = {m.name: m for m in members}
        for member in members:
            name = "/".join(plain_name(member.name, what))
            if member.issym():
                digests[name] = f"-> {member.linkname}"
                continue
            real = by_name.get(member.linkname) if member.islnk() else member
            if real is None or not real.isfile():
                continue
            digest = hashlib.sha256()
            handle = tar.extractfile(real)
            if handle is not None:
                while chunk := handle.read(_CHUNK):
                    digest.update(chunk)
            digests[name] = digest.hexdigest()
    return digests


def tree_matches(folder: Path, digests: Mapping[str, str], *, extras: bool) -> list[Path] | None:
    """The files of ``folder`` that :func:`zip_digests` / :func:`tar_digests` list, when each holds what is listed
    (re-hashed; a symlink must point where it did), else None. With ``extras`` other files may be there too (a
    bundle folder a rank wrote an output into); without, they make the folder not match (a Directory value)."""
    checked: list[Path] = []
    for name, want in digests.items():
        path = folder / name
        try:
            info = os.lstat(path)
        except OSError:
            return None
        if want.startswith("-> "):
            if not stat.S_ISLNK(info.st_mode) or os.readlink(path) != want[3:]:
                return None
        elif not stat.S_ISREG(info.st_mode) or _sha256(path) != want:
            return None
        checked.append(path)
    if not extras:
        for dirpath, dirnames, filenames in os.walk(folder):
            for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
                if Path(dirpath, name).relative_to(folder).as_posix() not in digests:
                    return None
    return checked


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
