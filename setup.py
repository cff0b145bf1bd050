"""Builds libinstanttensor.so with CMake against the installed torch and packages it.

    pip install --no-build-isolation .                  # contributors: into this environment
    bash scripts/build_wheel.sh                         # users: a wheel for this torch, in dist/

torch is deliberately not a build requirement: pip would fetch a multi-GB CUDA build into an
isolated environment, and the library must match the torch that will load it. So the wheel says
which torch it was built for: its version carries it as a local label (0.2.2+torch2.13) and it
requires that torch minor version (torch==2.13.*). Its library is relocatable: liburing linked
in statically, RUNPATH $ORIGIN/../torch/lib (the torch installed beside it), nothing of the
build machine's paths.
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
# Upstream InstantTensor's API level 0.2.2 (what vLLM 0.33 requires: instanttensor>=0.2.2). A
# local label names the torch a build is for; it keeps `>=0.2.2` and `==0.2.2` satisfied.
API_LEVEL = "0.2.2"


def _torch_build():
    """(minor version, local label) of the torch this build links, e.g. ("2.13", "torch2.13"),
    "torch2.13.cu130" for a CUDA torch; None where torch is not importable (an sdist built in an
    isolated environment: its version is the bare API level)."""
    try:
        import torch
    except ImportError:
        return None
    minor = ".".join(torch.__version__.split("+", 1)[0].split(".")[:2])
    label = f"torch{minor}"
    if torch.version.cuda:
        label += ".cu" + torch.version.cuda.replace(".", "")
    return minor, label


TORCH_BUILD = _torch_build()
VERSION = f"{API_LEVEL}+{TORCH_BUILD[1]}" if TORCH_BUILD else API_LEVEL
# The library loads only into the torch minor version it was built against: pip must refuse
# (or fetch) any other, rather than the import failing later.
TORCH_REQUIREMENT = f"torch=={TORCH_BUILD[0]}.*" if TORCH_BUILD else "torch>=2.11"


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
             # Relocatable: no liburing.so needed where it is installed, torch's libraries
             # found beside the package (site-packages/torch/lib), no build path inside.
             "-DINSTANTTENSOR_STATIC_LIBURING=ON", "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON",
             "-DCMAKE_INSTALL_RPATH=$ORIGIN/../torch/lib",
             # Installed into the package: the library at its root (where _library.py loads
             # it), headers and the CMake package config beside it for C++ consumers.
             "-DCMAKE_INSTALL_LIBDIR=.", "-DCMAKE_INSTALL_INCLUDEDIR=include",
             "-DINSTANTTENSOR_INSTALL_CMAKEDIR=share/cmake/instanttensor",
             # Extra CMake options, if any (scripts/test.sh: the testing hooks on).
             *shlex.split(os.environ.get("CMAKE_ARGS", ""))],
            build_dir)
        jobs = str(max(1, os.cpu_count() or 1))
        subprocess.check_call(["cmake", "--build", ".", "--target", "instanttensor", "-j", jobs],
                              cwd=build_dir)
        package_dir = os.path.abspath(os.path.join(self.build_lib, "instanttensor"))
        os.makedirs(package_dir, exist_ok=True)
        # CMake's install copies what differs (setuptools' copy_file would skip a destination
        # newer than the source, and build/lib is shared by every interpreter of this Python
        # version, so the library built for another torch, test_callers.sh's SGLang venv, could
        # otherwise be installed here).
        subprocess.check_call(["cmake", "--install", ".", "--prefix", package_dir],
                              cwd=build_dir)
        with open(os.path.join(package_dir, "_build_info.py"), "w") as out:
            out.write('"""Written by setup.py: what the native library was built against."""\n')
            out.write(f"TORCH_VERSION = {torch.__version__!r}\n")
            out.write(f"VERSION = {VERSION!r}\n")


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
    version=VERSION,  # instanttensor.__version__ reads it from _build_info.py
    description="Load safetensors checkpoints into torch tensors at the speed of the storage",
    packages=["instanttensor", "instanttensor.integrations"],
    package_dir={"instanttensor": "python_shim/instanttensor"},
    python_requires=">=3.9",
    install_requires=[TORCH_REQUIREMENT, "tqdm"],
    cmdclass={"build_py": CMakeBuild},
    distclass=BinaryDistribution,
    zip_safe=False,
)
