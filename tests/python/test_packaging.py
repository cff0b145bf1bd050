"""Installing the package from source: a machine without the system packages gets told which
ones to install, at once, instead of a CMake stack of "could not find a package configuration
file"."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def source_copy(destination: Path) -> Path:
    """The tracked files of the checkout, so the test's CMake cache never touches build/."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs the git checkout of the project")
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, check=True,
                           capture_output=True, text=True).stdout.split()
    for name in files:
        if (ROOT / name).is_file():
            target = destination / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, target)
    return destination


def test_a_missing_nlohmann_json_names_the_packages_and_the_command(tmp_path):
    source = source_copy(tmp_path / "src")
    env = dict(os.environ, CMAKE_ARGS="-DCMAKE_DISABLE_FIND_PACKAGE_nlohmann_json=ON")
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-q",
         "-w", str(tmp_path / "wheels"), str(source)],
        env=env, capture_output=True, text=True, timeout=600)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "nlohmann-json3-dev" in output and "apt-get install" in output, output[-3000:]
    assert "pip install --no-build-isolation ." in output
    # Stopped at configure: nothing was compiled.
    assert not list((source / "build").rglob("*.o")), "the build went on past configure"
