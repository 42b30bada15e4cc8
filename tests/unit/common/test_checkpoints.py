import json
import shutil
import sys

import pytest

from services.common import checkpoints
from services.common.checkpoints import load_manifest, publish_checkpoint, resolve_under_root, staging_dir
from services.common.errors import InvalidRequest, NotFound


def make(root, version="v1", files=None):
    staging = staging_dir(root, version)
    for name, data in (files or {"weights.safetensors": b"abc"}).items():
        (staging / name).write_bytes(data)
    return publish_checkpoint(staging, root / version, kind="retriever-query", version=version)


def test_publish_then_load_round_trip(tmp_path):
    manifest = make(tmp_path)
    folder, loaded = load_manifest(tmp_path, "v1")
    assert folder == tmp_path / "v1" and loaded == manifest
    assert loaded.files["weights.safetensors"] == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp")]


def test_sha_mismatch_is_refused(tmp_path):
    make(tmp_path)
    (tmp_path / "v1" / "weights.safetensors").write_bytes(b"abd")
    with pytest.raises(InvalidRequest, match="sha256 mismatch"):
        load_manifest(tmp_path, "v1")


def test_paths_outside_the_root_are_refused(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    for path in ["..", "../x", "/etc", str(tmp_path)]:
        with pytest.raises(InvalidRequest, match="inside the checkpoint root"):
            resolve_under_root(root, path)
    (root / "link").symlink_to(tmp_path)
    with pytest.raises(InvalidRequest):
        resolve_under_root(root, "link")


def test_pickles_and_missing_files_are_refused(tmp_path):
    make(tmp_path, "v2", {"model.bin": b"pickle"})
    with pytest.raises(InvalidRequest, match="safetensors only"):
        load_manifest(tmp_path, "v2")
    make(tmp_path, "v3")
    (tmp_path / "v3" / "weights.safetensors").unlink()
    with pytest.raises(InvalidRequest, match="missing"):
        load_manifest(tmp_path, "v3")
    with pytest.raises(NotFound):
        load_manifest(tmp_path, "nope")


def test_half_written_manifest_is_refused(tmp_path):
    make(tmp_path)
    manifest = tmp_path / "v1" / "manifest.json"
    manifest.write_text(manifest.read_text()[:40])
    with pytest.raises(InvalidRequest, match="invalid manifest"):
        load_manifest(tmp_path, "v1")
    manifest.write_text(json.dumps({"kind": "retriever-query", "version": "v1", "files": {}}))
    with pytest.raises(InvalidRequest, match="no files"):
        load_manifest(tmp_path, "v1")


def test_staging_folders_and_unusable_paths_are_refused_with_400(tmp_path):
    staging = staging_dir(tmp_path, "v9")
    (staging / "weights.safetensors").write_bytes(b"abc")
    (staging / "manifest.json").write_text("{}")
    with pytest.raises(InvalidRequest, match="staging"):  # a checkpoint still being written
        load_manifest(tmp_path, staging.name)
    # Found by schemathesis: these were 500s (ENAMETOOLONG from the file system, a NUL byte from pathlib).
    for path in ("0" * 4096, "a\x00b", "/".join(["x" * 255] * 20)):
        with pytest.raises(InvalidRequest, match="not usable"):
            load_manifest(tmp_path, path)


@pytest.mark.parametrize("swap", [True, False], ids=["swapped", "moved-aside"])
def test_replace_leaves_the_new_folder_and_nothing_else(tmp_path, monkeypatch, swap):
    if not swap:  # a system without renameat2's exchange
        monkeypatch.setattr(checkpoints, "exchange", lambda a, b: False)
    make(tmp_path, "v1", {"weights.safetensors": b"old"})
    manifest = make_replacing(tmp_path, "v1", b"new")
    _, loaded = load_manifest(tmp_path, "v1")
    assert loaded == manifest and (tmp_path / "v1" / "weights.safetensors").read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v1"]  # no staging, no `.v1.replaced-*`


@pytest.mark.skipif(sys.platform != "linux", reason="an atomic swap of two folders is renameat2's (Linux)")
def test_a_reader_finds_a_complete_folder_at_every_step_of_a_replace(tmp_path, monkeypatch):
    """Moving the old folder aside and then the new one in left a moment with no folder at the final path."""
    make(tmp_path, "v1", {"weights.safetensors": b"old"})
    seen: list[bytes] = []

    def look() -> None:  # what a registry loading v1 right now would find
        folder, _ = load_manifest(tmp_path, "v1")
        seen.append((folder / "weights.safetensors").read_bytes())

    def watched(real):
        def call(*args, **kwargs):
            look()
            result = real(*args, **kwargs)
            look()
            return result

        return call

    monkeypatch.setattr(checkpoints.os, "replace", watched(checkpoints.os.replace))
    monkeypatch.setattr(checkpoints.shutil, "rmtree", watched(shutil.rmtree))
    make_replacing(tmp_path, "v1", b"new")
    assert seen and seen[-1] == b"new" and set(seen) <= {b"old", b"new"}


def make_replacing(root, version, data):
    staging = staging_dir(root, version)
    (staging / "weights.safetensors").write_bytes(data)
    return publish_checkpoint(staging, root / version, replace=True, kind="retriever-query", version=version)


def test_a_file_linked_outside_the_root_is_refused_though_its_sha256_matches(tmp_path):
    root = tmp_path / "root"
    make(root)
    outside = tmp_path / "elsewhere.safetensors"
    outside.write_bytes(b"abc")  # the same bytes: the manifest's sha256 holds
    (root / "v1" / "weights.safetensors").unlink()
    (root / "v1" / "weights.safetensors").symlink_to(outside)
    with pytest.raises(InvalidRequest, match="symbolic link"):
        load_manifest(root, "v1")


def test_a_file_the_manifest_does_not_list_is_refused(tmp_path):
    make(tmp_path)
    (tmp_path / "v1" / "adapter_model.bin").write_bytes(b"a pickle a loader would read")
    with pytest.raises(InvalidRequest, match="does not list: adapter_model.bin"):
        load_manifest(tmp_path, "v1")


def test_publish_makes_the_rename_durable(tmp_path, monkeypatch):
    synced = []
    monkeypatch.setattr(checkpoints, "fsync_dir", synced.append)
    make(tmp_path)
    assert synced == [tmp_path]  # the folder that holds the new name
