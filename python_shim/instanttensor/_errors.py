"""Maps the engine's error kinds onto the Python exceptions users expect.

torch.ops turns every C++ exception into RuntimeError; the engine's messages start with
"[instanttensor:<kind>]", which names the Python type to raise. Every error raised this way is
both the built-in type (FileNotFoundError, ValueError, KeyError, ...) and `SafetensorError`, the
reference reader's exception, so `except ValueError` and `except SafetensorError` both catch it.
"""

from __future__ import annotations

import contextlib
import re
from typing import Iterator, NoReturn

import torch


class SafetensorError(Exception):
    """The reference reader's exception (`safetensors.SafetensorError`); every error the package
    raises for a file, a tensor or an argument is one, and also the built-in type it names."""


def _both(builtin: type[BaseException]) -> type[SafetensorError]:
    """The class that is SafetensorError and `builtin` at once, e.g. SafetensorValueError."""
    name = "Safetensor" + builtin.__name__
    return type(name, (SafetensorError, builtin), {"__module__": __name__, "__doc__":
                f"SafetensorError that is also a {builtin.__name__}."})


SafetensorFileNotFoundError = _both(FileNotFoundError)
SafetensorPermissionError = _both(PermissionError)
SafetensorOSError = _both(OSError)
SafetensorValueError = _both(ValueError)
SafetensorKeyError = _both(KeyError)
SafetensorTypeError = _both(TypeError)
SafetensorIndexError = _both(IndexError)
SafetensorRuntimeError = _both(RuntimeError)
SafetensorNotImplementedError = _both(NotImplementedError)
SafetensorOutOfMemoryError = _both(torch.OutOfMemoryError)

_KIND_TO_TYPE: dict[str, type[Exception]] = {
    "not_found": SafetensorFileNotFoundError,
    "permission": SafetensorPermissionError,
    "io": SafetensorOSError,
    "format": SafetensorValueError,
    "argument": SafetensorValueError,
    "key": SafetensorKeyError,
    "internal": SafetensorRuntimeError,  # a broken invariant of the library: a bug to report
    "out_of_memory": SafetensorOutOfMemoryError,  # a device allocation, on this rank or another
}
_PATTERN = re.compile(r"\[instanttensor:(\w+)\][^\n]*")


def translate_error(error: BaseException) -> BaseException:
    """The mapped exception for an engine RuntimeError, or `error` itself when it is not ours."""
    match = _PATTERN.search(str(error))
    if not isinstance(error, RuntimeError) or match is None:
        return error
    return _KIND_TO_TYPE.get(match.group(1), SafetensorRuntimeError)(match.group(0))


def raise_translated(error: RuntimeError) -> NoReturn:
    """Raises `error` as its mapped type (FileNotFoundError, ValueError, KeyError, ...), or itself
    when it is not the engine's. For an `except RuntimeError` block where engine_errors()'s
    generator would cost as much as the call it guards."""
    mapped = translate_error(error)
    if mapped is error:
        raise error
    raise mapped from None


@contextlib.contextmanager
def engine_errors() -> Iterator[None]:
    """Re-raises engine errors from the block as FileNotFoundError, ValueError, KeyError, ..."""
    try:
        yield
    except RuntimeError as error:
        raise_translated(error)
