"""The README's environment table states the defaults the engine uses (plan/defaults.h, through
torch.ops.instanttensor.defaults), so the two cannot drift apart."""

from __future__ import annotations

import pathlib
import re

import torch

import instanttensor  # noqa: F401  (loads the library)

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def environment_table() -> dict[str, str]:
    """Variable -> its default cell, from the README's table under "Environment variables"."""
    text = README.read_text()
    section = text.split("## Environment variables", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`INSTANTTENSOR_"):
            rows[cells[0].strip("`")] = cells[2]
    return rows


def test_the_readme_states_every_default_of_the_engine():
    variables, values = torch.ops.instanttensor.defaults()
    assert variables, "the engine's table is empty"
    table = environment_table()
    for variable, value in zip(variables, values):
        assert variable in table, f"{variable} has no row in README.md's environment table"
        cell = table[variable]
        # A whole value: "4" must not match inside "64 MiB" or "4 MiB", nor "8 MiB" in "128 MiB".
        whole = rf"(^|[\s(]){re.escape(value)}($|[;,)]|\s(?!MiB|KiB|GiB))"
        assert re.search(whole, cell), f"README says {cell!r} for {variable}, the engine {value}"
