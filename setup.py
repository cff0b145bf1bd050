"""Builds libinstanttensor.so with CMake against the installed torch and packages it.

    pip install --no-build-isolation .

torch is deliberately not a build requirement: pip would fetch a multi-GB CUDA build into an
isolated environment, and the library must match the torch that will load it.
"""

import hashlib
import os
import shlex
import shutil
import subprocess
import sys

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

ROOT = os.path.dirname(os.path.abspath(__file__))


class CMakeBuild(build_py):
    """Configures and builds the CMake project, then copies the library into the package."""

    def run(self):
        super().run()
        import torch
        import torch.utils

        # One build folder per interpreter and torch: a CMake cache keeps the torch it found.
        key = hashlib.sha1(f"{sys.prefix}:{torch.__version__}".encode()).hexdigest()[:12]
        build_dir = os.path.join(ROOT, "build", f"python-{key}")
        os.makedirs(build_dir, exist_ok=True)
        generator = ["-G", "Ninja"] if _has_ninja() else []
        if shutil.which("cmake") is None:
            raise SystemExit(MISSING_SYSTEM_PACKAGES.format(what="cmake is not on PATH"))
        _configure(
            ["cmake", ROOT, *generator, "-DCMAKE_BUILD_TYPE=Release",
             f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}",
             f"-DPython3_EXECUTABLE={sys.executable}",
             "-DINSTANTTENSOR_BUILD_TESTS=OFF", "-DINSTANTTENSOR_BUILD_EXAMPLES=OFF",
             # A release library: no test switch, even where the cached build had them.
             "-DINSTANTTENSOR_TESTING_HOOKS=OFF",
             # Extra CMake options, if any (scripts/test.sh: the testing hooks on).
             *shlex.split(os.environ.get("CMAKE_ARGS", ""))],
            build_dir)
        jobs = str(max(1, os.cpu_count() or 1))
        subprocess.check_call(["cmake", "--build", ".", "--target", "instanttensor", "-j", jobs],
                              cwd=build_dir)
        package_dir = os.path.join(self.build_lib, "instanttensor")
        os.makedirs(package_dir, exist_ok=True)
        # Always copied: setuptools' copy_file skips a destination newer than the source, and
        # build/lib is shared by every interpreter of this Python version, so the library built
        # for another torch (test_callers.sh's SGLang venv) would otherwise be installed here.
        shutil.copy2(os.path.join(build_dir, "libinstanttensor.so"),
                     os.path.join(package_dir, "libinstanttensor.so"))
        with open(os.path.join(package_dir, "_build_info.py"), "w") as out:
            out.write('"""Written by setup.py: what the native library was built against."""\n')
            out.write(f"TORCH_VERSION = {torch.__version__!r}\n")


MISSING_SYSTEM_PACKAGES = """
instanttensor could not be configured: {what}.
It builds with CMake against the installed torch and needs these system packages:
  Debian/Ubuntu:  sudo apt-get install cmake g++ nlohmann-json3-dev liburing-dev
(liburing-dev is optional: it adds the io_uring backend; ninja-build makes the build faster.)
Then run again:  pip install --no-build-isolation .
"""


def _configure(command, build_dir):
    """Runs CMake's configure step; a failure ends the install with what to apt-get install
    (CMake's own message, printed above it, says which package it missed)."""
    try:
        subprocess.check_call(command, cwd=build_dir)
    except subprocess.CalledProcessError:
        raise SystemExit(MISSING_SYSTEM_PACKAGES.format(
            what="CMake's configure step failed (its message is above)")) from None


def _has_ninja():
    return shutil.which("ninja") is not None


class BinaryDistribution(Distribution):
    """The wheel carries a native library: never tag it as pure Python."""

    def has_ext_modules(self):
        return True


setup(
    name="instanttensor",
    # Upstream InstantTensor's API level 0.2.2 (what vLLM 0.33 requires: instanttensor>=0.2.2), built
    # on libtorch: the local label keeps `>=0.2.2` and `==0.2.2` pins satisfied while naming
    # this build apart from upstream's wheel. Keep in step with __init__.__version__.
    version="0.2.2+libtorch",
    description="Load safetensors checkpoints into torch tensors at the speed of the storage",
    packages=["instanttensor", "instanttensor.integrations"],
    package_dir={"instanttensor": "python_shim/instanttensor"},
    python_requires=">=3.9",
    install_requires=["torch>=2.11", "tqdm"],
    cmdclass={"build_py": CMakeBuild},
    distclass=BinaryDistribution,
    zip_safe=False,
)
