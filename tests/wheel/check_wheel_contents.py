"""What a built wheel says and carries (scripts/check_wheel.sh, before it installs it):

- its version names the torch it was built for (0.2.2+torch2.13) and it requires that minor
  version (torch==2.13.*), so pip pairs it with no other torch;
- its platform tag is a manylinux one (auditwheel repaired it) and nothing was grafted into it;
- its library needs only torch's libraries and the C/C++ runtime (liburing is inside), finds
  torch through RUNPATH $ORIGIN/../torch/lib, and holds no path of the build machine;
- headers and the CMake package config are inside, for C++ consumers.

    python check_wheel_contents.py WHEEL SOURCE_ROOT
"""

from __future__ import annotations

import email.parser
import os
import subprocess
import sys
import tempfile
import zipfile

import torch

# The C and C++ runtime every manylinux platform provides, and torch's own libraries (the
# wheel requires torch, which brings them).
ALLOWED_NEEDED = {"libc.so.6", "libm.so.6", "libstdc++.so.6", "libgcc_s.so.1", "libpthread.so.0",
                  "libdl.so.2", "librt.so.1", "ld-linux-x86-64.so.2", "libtorch.so",
                  "libtorch_cpu.so", "libc10.so"}


def dynamic_section(library: str) -> tuple[set[str], list[str]]:
    """(NEEDED sonames, RUNPATH entries) as readelf prints them."""
    output = subprocess.run(["readelf", "-d", library], check=True, capture_output=True,
                            text=True).stdout
    needed, runpath = set(), []
    for line in output.splitlines():
        value = line.split("[", 1)[1].rsplit("]", 1)[0] if "[" in line else ""
        if "(NEEDED)" in line:
            needed.add(value)
        elif "(RUNPATH)" in line or "(RPATH)" in line:
            runpath += value.split(":")
    return needed, runpath


def main() -> None:
    wheel, source_root = sys.argv[1], os.path.realpath(sys.argv[2])
    minor = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    archive = zipfile.ZipFile(wheel)
    names = archive.namelist()
    info = next(name for name in names if name.endswith(".dist-info/METADATA"))
    metadata = email.parser.Parser().parsestr(archive.read(info).decode())
    label = f"torch{minor}" + (".cu" + torch.version.cuda.replace(".", "")
                               if torch.version.cuda else "")
    assert metadata["Version"] == f"0.2.2+{label}", metadata["Version"]
    requires = metadata.get_all("Requires-Dist")
    assert f"torch=={minor}.*" in requires, requires
    tags = archive.read(info.replace("METADATA", "WHEEL")).decode()
    platforms = [line.split("-")[-1] for line in tags.splitlines() if line.startswith("Tag:")]
    assert platforms and all(p.startswith("manylinux_") for p in platforms), tags
    assert not [name for name in names if ".libs/" in name], "auditwheel grafted libraries"
    for member in ["instanttensor/libinstanttensor.so", "instanttensor/_build_info.py",
                   "instanttensor/include/instanttensor/instanttensor.h",
                   "instanttensor/share/cmake/instanttensor/instanttensorConfig.cmake",
                   "instanttensor/share/cmake/instanttensor/LibTorch.cmake"]:
        assert member in names, f"{member} is not in the wheel"
    with tempfile.TemporaryDirectory() as folder:
        library = archive.extract("instanttensor/libinstanttensor.so", folder)
        needed, runpath = dynamic_section(library)
        assert needed <= ALLOWED_NEEDED, f"the library needs {sorted(needed - ALLOWED_NEEDED)}"
        assert runpath == ["$ORIGIN/../torch/lib"], runpath
        data = open(library, "rb").read()
    torch_root = os.path.realpath(os.path.dirname(torch.__file__))
    for path in [source_root, torch_root, os.path.dirname(torch_root)]:
        assert path.encode() not in data, f"the library holds the build path {path}"
    print(f"{os.path.basename(wheel)}: Requires-Dist {sorted(requires)}; NEEDED "
          f"{sorted(needed)}; RUNPATH {runpath[0]}; no build path inside")


if __name__ == "__main__":
    main()
