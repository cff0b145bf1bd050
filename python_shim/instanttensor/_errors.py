"""Maps the engine's error kinds onto the Python exceptions users expect.

torch.ops turns every C++ exception into RuntimeError; the engine's messages start with
"[instanttensor:<kind>]", which names the Python type to raise.
"""

from __future__ import annotations

import contextlib
import re
from typing import Iterator

_KIND_TO_TYPE: dict[str, type[Exception]] = {
    "not_found": FileNotFoundError,
    "permission": PermissionError,
    "io": OSError,
    "format": ValueError,
    "argument": ValueError,
    "key": KeyError,
}
_PATTERN = re.compile(r"\[instanttensor:(\w+)\][^\n]*")


def translate_error(error: BaseException) -> BaseException:
    """The mapped exception for an engine RuntimeError, or `error` itself when it is not ours."""
    match = _PATTERN.search(str(error))
    if not isinstance(error, RuntimeError) or match is None:
        return error
    return _KIND_TO_TYPE.get(match.group(1), RuntimeError)(match.group(0))


@contextlib.contextmanager
def engine_errors() -> Iterator[None]:
    """Re-raises engine errors from the block as FileNotFoundError, ValueError, KeyError, ..."""
    try:
        yield
    except RuntimeError as error:
        mapped = translate_error(error)
        if mapped is error:
            raise
        raise mapped from None
