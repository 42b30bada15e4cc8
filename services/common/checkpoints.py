"""Checkpoint folders: safetensors files plus `manifest.json` with the sha256 of every file.

Writers build a folder under a temporary name and `publish_checkpoint` renames it into place (or swaps it with
the folder it replaces), so a reader never sees a half-written checkpoint, nor none. Readers call
`load_manifest`, which refuses paths outside the root, non-safetensors payloads, symbolic links, files the
manifest does not list and any file whose sha256 differs from the manifest; a loader that reads the files again
later (an engine) reads `copy_verified`'s private copy, hashed as it was made. `remove_leftovers` clears what a
writer that crashed mid-publish left behind.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import json
import os
import shutil
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from services.common.errors import InvalidRequest, NotFound

MANIFEST = "manifest.json"
# A staging folder changed this recently may be another process's (the trainer's), being filled now.
STAGING_STALE_S = 3600.0
CheckpointKind = Literal["retriever-query", "retriever-full", "policy-lora"]


class Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: CheckpointKind
    version: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
    parent: str | None = None
    algorithm: str | None = None
    round: int | None = None
    metrics: dict[str, float] = Field(default_factory=dict)
    created_at: str = Field(default_factory=lambda: datetime.now(UTC).isoformat())
    base_model: str | None = None
    files: dict[str, str] = Field(description="file name -> sha256 hex digest")
    extra: dict[str, Any] = Field(default_factory=dict)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def resolve_under_root(root: Path, path: str | Path) -> Path:
    """`path` (absolute, or relative to `root`) resolved; refused when it leaves `root`."""
    root = root.resolve()
    try:
        candidate = Path(path)
        resolved = (candidate if candidate.is_absolute() else root / candidate).resolve()
    except (OSError, ValueError) as exc:  # a NUL byte, a name too long for the file system: the caller's mistake
        raise InvalidRequest(f"checkpoint path is not usable: {exc}", param="path") from exc
    if not resolved.is_relative_to(root):
        raise InvalidRequest(f"checkpoint path must be inside the checkpoint root {root}", param="path")
    if any(part.startswith(".") for part in resolved.relative_to(root).parts):
        # `.tmp-*` folders are checkpoints still being written (see `staging_dir`).
        raise InvalidRequest("hidden or staging folders (a name starting with '.') cannot be checkpoints", param="path")
    return resolved


def load_manifest(root: Path, path: str | Path) -> tuple[Path, Manifest]:
    """Validate a checkpoint folder completely (layout, file types, every sha256) before anything loads it."""
    folder = resolve_under_root(root, path)
    try:
        is_dir = folder.is_dir()
    except OSError as exc:  # ENAMETOOLONG and friends: is_dir only swallows "does not exist"
        raise InvalidRequest(f"checkpoint path is not usable: {exc.strerror}", param="path") from exc
    if not is_dir:
        raise NotFound(f"no checkpoint folder at {folder}", param="path")
    manifest_path = folder / MANIFEST
    if not manifest_path.is_file():
        raise InvalidRequest(f"{folder} has no {MANIFEST}", param="path")
    try:
        manifest = Manifest.model_validate_json(manifest_path.read_text())
    except ValueError as exc:
        raise InvalidRequest(f"invalid {MANIFEST}: {exc}", param="path") from exc
    if not manifest.files:
        raise InvalidRequest("manifest lists no files", param="path")
    # A loader (vLLM's included) reads the whole folder: nothing may be in it that the manifest does not vouch for.
    unlisted = sorted(p.name for p in folder.iterdir() if p.name != MANIFEST and p.name not in manifest.files)
    if unlisted:
        raise InvalidRequest(
            f"{folder} holds files its manifest does not list: {', '.join(unlisted[:5])}", param="path"
        )
    for name, expected in manifest.files.items():
        if "/" in name or name.startswith(".") or not name.endswith((".safetensors", ".json")):
            raise InvalidRequest(f"checkpoint file {name!r} is not allowed (safetensors only)", param="path")
        file = folder / name
        if file.is_symlink():  # it could name any file on the host, outside the checkpoint root
            raise InvalidRequest(f"checkpoint file {name} is a symbolic link", param="path")
        if not file.is_file():
            raise InvalidRequest(f"checkpoint file {name} is missing", param="path")
        actual = sha256_file(file)
        if actual != expected:
            raise InvalidRequest(
                f"sha256 mismatch for {name}: manifest {expected[:12]}…, file {actual[:12]}…",
                param="path",
                code="sha256_mismatch",
            )
    return folder, manifest


def copy_verified(folder: Path, manifest: Manifest, dest: Path) -> Path:
    """A private copy of `folder`'s listed files at `dest`, each hashed as it is copied and checked against the
    manifest: what a loader then reads is what was verified, whatever happens to `folder` after `load_manifest`
    hashed it (a file swapped in between, a link put in its place: O_NOFOLLOW refuses it). `dest` is replaced."""
    staging = dest.with_name(f".{dest.name}.{uuid.uuid4().hex[:8]}.tmp")
    staging.mkdir(parents=True)
    try:
        for name, expected in manifest.files.items():
            digest = hashlib.sha256()
            try:
                source = os.open(folder / name, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
            except OSError as exc:
                raise InvalidRequest(f"checkpoint file {name} cannot be read: {exc.strerror}", param="path") from exc
            with os.fdopen(source, "rb") as src, (staging / name).open("wb") as out:
                for chunk in iter(lambda: src.read(1 << 20), b""):
                    digest.update(chunk)
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
            if digest.hexdigest() != expected:
                raise InvalidRequest(f"{name} changed after it was verified (sha256 {digest.hexdigest()[:12]}…, "
                                     f"manifest {expected[:12]}…)", param="path", code="sha256_mismatch")  # fmt: skip
        (staging / MANIFEST).write_text(manifest.model_dump_json(indent=1))
        if dest.exists():
            shutil.rmtree(dest)
        staging.replace(dest)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return dest


def staging_dir(root: Path, version: str) -> Path:
    """A fresh temporary folder beside the final one; hand it to `publish_checkpoint` when the files are in."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / f".tmp-{version}-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    return path


def exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths in one step (Linux's renameat2 RENAME_EXCHANGE): each name always names a complete
    folder. False where the system cannot (another OS, a libc or file system without it); nothing moved then."""
    if sys.platform != "linux":
        return False
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except AttributeError:  # glibc before 2.28
        return False
    renameat2.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint)
    at_fdcwd, rename_exchange = -100, 2  # <fcntl.h>, <linux/fs.h>
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))


def publish_checkpoint(staging: Path, final: Path, *, replace: bool = False, **manifest_fields: Any) -> Manifest:
    """Hash every file in `staging`, write the manifest, fsync, and rename the folder to `final` atomically.

    `replace`: an existing `final` (an earlier attempt's, never published) is swapped with `staging` in one step,
    then removed; where the system cannot swap, it is moved aside first (a moment with no folder at `final`)."""
    files = {p.name: sha256_file(p) for p in sorted(staging.iterdir()) if p.is_file() and p.name != MANIFEST}
    manifest = Manifest(files=files, **manifest_fields)
    (staging / MANIFEST).write_text(manifest.model_dump_json(indent=2))
    for p in staging.iterdir():
        with p.open("rb") as fh:
            os.fsync(fh.fileno())
    if not final.exists():
        os.replace(staging, final)
        fsync_dir(final.parent)
        return manifest
    if not replace:
        shutil.rmtree(staging)
        raise InvalidRequest(f"checkpoint {final} already exists", param="version")
    old = staging  # after the swap, the old folder is at the staging path
    if not exchange(staging, final):
        old = final.with_name(f".{final.name}.replaced-{uuid.uuid4().hex[:6]}")
        os.replace(final, old)
        os.replace(staging, final)
    fsync_dir(final.parent)
    # ignore_errors: another process's `remove_leftovers` may be removing it too; what stays goes at a next start
    shutil.rmtree(old, ignore_errors=True)
    return manifest


def fsync_dir(folder: Path) -> None:
    """Make a rename in `folder` durable: without it a power cut may leave the old name (POSIX keeps the rename in
    the directory's own metadata). A no-op where directories cannot be opened (Windows)."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def last_change(folder: Path) -> float:
    """The newest mtime of a folder and the entries in it (a file being written updates only its own)."""
    return max([folder.stat().st_mtime, *(p.stat().st_mtime for p in folder.iterdir())])


def remove_leftovers(root: Path, stale_after_s: float = STAGING_STALE_S) -> list[str]:
    """What a writer that crashed in `publish_checkpoint` left in `root`: an old folder moved aside by a replace
    (`.<version>.replaced-*`, never read again), and staging folders (`.tmp-*`) unchanged for `stale_after_s`.
    Removes them; returns their names."""
    if not root.is_dir():
        return []
    removed = []
    now = time.time()
    for path in root.iterdir():
        name = path.name
        try:
            if not path.is_dir() or path.is_symlink():
                continue
            replaced = name.startswith(".") and ".replaced-" in name
            if not replaced and not (name.startswith(".tmp-") and now - last_change(path) > stale_after_s):
                continue
        except FileNotFoundError:  # its writer published or removed it meanwhile
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(name)
    return removed


def write_json_atomic(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:6]}.tmp")
    tmp.write_text(json.dumps(data, indent=2))
    with tmp.open("rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)
