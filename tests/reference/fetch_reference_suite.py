"""Fetches safetensors' own Python test suite (from its source distribution on the package index
pip uses) for the installed safetensors version, and prints the folder holding `tests/`.

The suite is not copied into this repository: it is the reference's, fetched by version and
checked against the sha256 the index publishes. Cached under the folder given as argv[1].
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import urllib.request
from importlib import metadata

# The index pip is configured with, else pip's default one.
def _index_url() -> str:
    configured = subprocess.run([sys.executable, "-m", "pip", "config", "get", "global.index-url"],
                                capture_output=True, text=True)
    if configured.returncode == 0 and configured.stdout.strip():
        return configured.stdout.strip().rstrip("/")
    from pip._internal.models.index import PyPI

    return PyPI.simple_url.rstrip("/")


def _sdist(version: str) -> tuple[str, str]:
    """(url, sha256) of safetensors-<version>.tar.gz, from the index's JSON page (PEP 691)."""
    request = urllib.request.Request(f"{_index_url()}/safetensors/",
                                     headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        page = json.load(response)
    wanted = f"safetensors-{version}.tar.gz"
    for entry in page["files"]:
        if entry["filename"] == wanted:
            return entry["url"], entry["hashes"]["sha256"]
    raise SystemExit(f"{wanted} is not on the index")


def main() -> None:
    cache = os.path.abspath(sys.argv[1])
    version = metadata.version("safetensors")
    root = os.path.join(cache, f"safetensors-{version}")
    suite = os.path.join(root, "bindings", "python")
    if os.path.isdir(os.path.join(suite, "tests")):
        print(suite)
        return
    url, sha256 = _sdist(version)
    with urllib.request.urlopen(url, timeout=300) as response:
        data = response.read()
    if hashlib.sha256(data).hexdigest() != sha256:
        raise SystemExit(f"safetensors-{version}.tar.gz: sha256 differs from the index's")
    shutil.rmtree(root, ignore_errors=True)
    prefix = f"safetensors-{version}/bindings/python/tests/"
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
        members = [m for m in archive.getmembers() if m.name.startswith(prefix) and m.isfile()]
        archive.extractall(cache, members=members, filter="data")
    print(suite)


if __name__ == "__main__":
    main()
