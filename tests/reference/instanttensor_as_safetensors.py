"""A pytest plugin that runs safetensors' own Python suite against instanttensor.

Loaded with `-p instanttensor_as_safetensors` before the suite is collected, it puts stand-in
modules under the names `safetensors`, `safetensors.torch` and `safetensors.numpy`. Every public
name of a stand-in is instanttensor's: a public name we lack is missing (the importing test
fails). Only underscore helpers we do not define come from the reference, as the issue allows.
"""

from __future__ import annotations

import importlib
import sys
import types

_FACES = {
    "safetensors": "instanttensor",
    "safetensors.torch": "instanttensor.torch",
    "safetensors.numpy": "instanttensor.numpy",
}


def _stand_in(name: str, ours: types.ModuleType, reference: types.ModuleType) -> types.ModuleType:
    module = types.ModuleType(name, f"instanttensor standing in for {name}")
    for attribute in dir(ours):
        if not attribute.startswith("__"):
            setattr(module, attribute, getattr(ours, attribute))
    borrowed = []
    for attribute in dir(reference):
        if attribute.startswith("_") and not attribute.startswith("__") and \
                not hasattr(module, attribute) and not isinstance(
                    getattr(reference, attribute), types.ModuleType):
            setattr(module, attribute, getattr(reference, attribute))
            borrowed.append(attribute)
    module.__borrowed_from_reference__ = sorted(borrowed)
    return module


def _install() -> None:
    references = {name: importlib.import_module(name) for name in _FACES}
    stand_ins = {}
    for name, ours_name in _FACES.items():
        stand_ins[name] = _stand_in(name, importlib.import_module(ours_name), references[name])
    stand_ins["safetensors"].torch = stand_ins["safetensors.torch"]
    stand_ins["safetensors"].numpy = stand_ins["safetensors.numpy"]
    sys.modules.update(stand_ins)


_install()


def pytest_report_header(config):
    lines = []
    for name in _FACES:
        borrowed = sys.modules[name].__borrowed_from_reference__
        lines.append(f"{name}: instanttensor's names; underscore helpers from the reference: "
                     f"{', '.join(borrowed) or 'none'}")
    return lines
