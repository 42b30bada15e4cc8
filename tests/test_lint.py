import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_ruff_check_and_format_are_clean():
    ruff = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    check = subprocess.run([ruff, "check", "."], cwd=REPO, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    fmt = subprocess.run([ruff, "format", "--check", "."], cwd=REPO, capture_output=True, text=True)
    assert fmt.returncode == 0, fmt.stdout + fmt.stderr
