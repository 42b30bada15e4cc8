"""constraints.txt, the lock (scripts/lock.sh): it pins every dependency pyproject.toml names, at a version
pyproject.toml allows, and this environment (built by scripts/install.sh from it) holds exactly those versions."""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
LEFT_OUT = {"torch", "torchvision", "torchaudio", "torchcodec"}  # pinned and installed apart (scripts/lock.sh)


def locked() -> dict[str, str]:
    pins = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[canonicalize_name(name.split("[")[0])] = version.split(";")[0].strip()
    return pins


def test_the_lock_pins_every_dependency_at_a_version_pyproject_allows():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = [*project["dependencies"], *project["optional-dependencies"]["dev"],
              *project["optional-dependencies"]["trackers"], *project["optional-dependencies"]["vllm"]]  # fmt: skip
    pins = locked()
    unmet = []
    for text in wanted:
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        if name in LEFT_OUT or (requirement.marker is not None and not requirement.marker.evaluate()):
            continue
        if name not in pins or not requirement.specifier.contains(pins[name], prereleases=True):
            unmet.append(f"{text} (locked: {pins.get(name, 'missing')})")
    assert not unmet, f"constraints.txt is stale, run scripts/lock.sh: {unmet}"


def test_this_environment_holds_the_locked_versions():
    drifted = []
    for name, version in locked().items():
        try:
            installed = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue  # for another Python or platform (a marker), or an extra this install left out
        if installed != version:
            drifted.append(f"{name} {installed} (locked {version})")
    assert not drifted, f"installed versions differ from constraints.txt: {drifted}"
