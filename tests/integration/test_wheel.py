"""The built wheel carries every file the product reads at run time (the console's static files, the demo data,
the shipped warm-start adapter), and an install of it works on its own: built from a copy of the sources (git's
files, untracked ones too, less the ignored), installed into a fresh virtual environment whose dependencies come
from this one's site-packages (a .pth file, so nothing heavy is reinstalled), run from an empty directory so neither
the checkout nor its editable install is what gets imported."""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.timeout(120)

# From the installed package only: where it is, the adapter's sha256 check that `bridge-rl prepare` runs first,
# and the data folders each reader points at.
RUNTIME_CHECK = textwrap.dedent(
    """
    import sys
    from pathlib import Path

    import services
    from services.cli.demo import DEMO
    from services.console.routes.pages import STATIC
    from services.trainer.settings import DEMO_QA_DIR
    from services.modeling.shipped import SHIPPED_ADAPTERS, verify_adapter

    venv = Path(sys.prefix).resolve()
    assert Path(services.__file__).resolve().is_relative_to(venv), services.__file__
    for adapter in SHIPPED_ADAPTERS.values():  # the default one and every other `prepare --adapter` can merge
        manifest = verify_adapter(adapter)
        assert {"adapter_model.safetensors", "adapter_config.json"} <= set(manifest["files"]), manifest["files"]
    for folder, name in [(DEMO, "hotpotqa_corpus.jsonl"), (DEMO_QA_DIR, "hotpotqa_train.jsonl"),
                         (STATIC, "index.html"), (STATIC, "console.js")]:
        assert folder.resolve().is_relative_to(venv), folder
        assert (folder / name).stat().st_size > 0, folder / name
    print("installed package OK", services.__file__)
    """
)


def tracked_sources() -> list[str]:
    """Paths (relative to the repo) that go into the build: pyproject, README and services/ as `pip install .` sees
    it (tracked and untracked files, not the ignored ones such as __pycache__)."""
    listing = ["git", "ls-files", "--cached", "--others", "--exclude-standard", "services"]
    try:
        listed = subprocess.run(listing, cwd=REPO, capture_output=True, text=True, check=True, timeout=30).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tracked files are unknown")
    return ["pyproject.toml", "README.md", *(p for p in listed.split() if (REPO / p).is_file())]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    for rel in tracked_sources():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, src / rel)
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
         "-w", str(tmp / "dist"), str(src)],
        capture_output=True, text=True, timeout=90,
    )  # fmt: skip
    assert build.returncode == 0, build.stdout + build.stderr
    [built] = (tmp / "dist").glob("bridge_rl-*.whl")
    return built


def test_the_wheel_holds_every_file_of_services(wheel):
    with zipfile.ZipFile(wheel) as archive:
        inside = set(archive.namelist())
    missing = [p for p in tracked_sources() if p.startswith("services/") and p not in inside]
    assert not missing, f"left out of the wheel (pyproject's package-data): {missing}"


def test_the_installed_wheel_prepares_from_its_own_files(wheel, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    python = venv / "bin" / "python"
    install = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index", str(wheel)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert install.returncode == 0, install.stdout + install.stderr
    # The dependencies: this environment's site-packages, appended after the new one's (a .pth line adds the folder
    # only; the .pth files in it, among them the editable install's finder, are not run).
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True, timeout=30).stdout.strip()  # fmt: skip
    Path(purelib, "bridge_test_deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}

    help_run = subprocess.run([str(venv / "bin" / "bridge-rl"), "prepare", "--help"], cwd=cwd, env=env,
                              capture_output=True, text=True, timeout=60)  # fmt: skip
    assert help_run.returncode == 0, help_run.stdout + help_run.stderr
    assert "Usage" in help_run.stdout

    check = subprocess.run([str(python), "-c", RUNTIME_CHECK], cwd=cwd, env=env, capture_output=True, text=True,
                           timeout=60)  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    assert "installed package OK" in check.stdout
