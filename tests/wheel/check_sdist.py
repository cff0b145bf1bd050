"""The sdist (`python -m build --sdist`) holds what a source build needs: every tracked file of
the CMake project and of the Python package; nothing of the build folders, the tests or the
benchmark results; its version is the bare API level (a source build adds the torch label).

    python check_sdist.py SDIST SOURCE_ROOT
"""

from __future__ import annotations

import subprocess
import sys
import tarfile


def main() -> None:
    sdist, root = sys.argv[1], sys.argv[2]
    with tarfile.open(sdist) as archive:
        members = archive.getnames()
        top = members[0].split("/")[0]
        files = {name.split("/", 1)[1] for name in members if "/" in name}
        pkg_info = archive.extractfile(f"{top}/PKG-INFO").read().decode()
    assert top == "instanttensor-0.2.2", top
    assert "\nVersion: 0.2.2\n" in pkg_info
    tracked = subprocess.run(["git", "ls-files"], cwd=root, check=True, capture_output=True,
                             text=True).stdout.split()
    needed = [name for name in tracked
              if name.split("/")[0] in {"cmake", "include", "ops", "python_shim"}
              or name in {"CMakeLists.txt", "setup.py", "pyproject.toml", "README.md",
                          "MANIFEST.in"}]
    missing = sorted(set(needed) - files)
    assert not missing, f"the sdist lacks {missing}"
    unwanted = sorted(name for name in files
                      if name.split("/")[0] in {"build", "dist", "benchmarks", "tests", ".venv"}
                      or name.endswith((".so", ".pyc", "_build_info.py")))
    assert not unwanted, f"the sdist carries {unwanted[:10]}"
    print(f"{sdist}: {len(files)} files, every source of the build, no build folder, test or "
          "benchmark result")


if __name__ == "__main__":
    main()
