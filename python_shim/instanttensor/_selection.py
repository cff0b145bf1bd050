"""Which tensors a safe_open selects: `keys=` (ours) or upstream 0.2.2's `tensor_filter=`.

A filter is a list of patterns matched against whole tensor names, case-sensitive, in one of
three modes: "glob" (fnmatchcase rules; a pattern without `*?[` is a literal name), "exact" and
"regex" (`re.fullmatch`). The matching names become the engine's `keys`, so only their bytes are
read and only they count in total_tensor_size, keys() and buffer sizing.
"""

from __future__ import annotations

import fnmatch
import re
from typing import Any, Callable

import torch

from ._errors import SafetensorTypeError, SafetensorValueError, engine_errors

MATCH_MODES = ("glob", "exact", "regex")


def name_matcher(patterns: Any, mode: Any) -> Callable[[str], bool]:
    """A predicate for `patterns` in `mode`. Raises ValueError for an unknown mode or a bad regex
    (naming it) and TypeError for patterns that are not a list of str (upstream's rule: a tuple,
    a set or a bare string is refused, so a typo never selects by characters)."""
    if mode not in MATCH_MODES:
        raise SafetensorValueError(f"tensor_name_match_mode={mode!r} is not valid; accepted: "
                         + ", ".join(repr(m) for m in MATCH_MODES))
    if not isinstance(patterns, list) or any(not isinstance(p, str) for p in patterns):
        raise SafetensorTypeError("tensor_filter must be a list of strings (name patterns), not "
                        f"{type(patterns).__name__}")
    literal = set()
    compiled = []
    for pattern in patterns:
        if mode == "exact" or (mode == "glob" and not any(c in pattern for c in "*?[")):
            literal.add(pattern)
            continue
        try:
            compiled.append(re.compile(fnmatch.translate(pattern) if mode == "glob" else pattern))
        except re.error as error:
            raise SafetensorValueError(f"tensor_filter pattern {pattern!r} is not a valid "
                             f"{'glob' if mode == 'glob' else 'regular expression'}: "
                             f"{error}") from None
    if not compiled:
        return literal.__contains__
    return lambda name: name in literal or any(p.fullmatch(name) is not None for p in compiled)


class Selection:
    """A validated selection, checked before any file is opened: both `keys` and
    `tensor_filter` is a ValueError, so is `keys` given as one string; a bad filter or mode
    raises as name_matcher does (a bad mode even without a filter)."""

    def __init__(self, keys: Any, tensor_filter: Any, match_mode: Any) -> None:
        if keys is not None and tensor_filter is not None:
            raise SafetensorValueError("pass keys= (exact names, unknown ones are a KeyError) or "
                             "tensor_filter= (patterns), not both")
        if isinstance(keys, str):
            raise SafetensorValueError("keys must be a list of tensor names, not a string")
        self._keys = None if keys is None else [str(k) for k in keys]
        self._matches = name_matcher([] if tensor_filter is None else tensor_filter, match_mode)
        self._filter = tensor_filter

    def keys_of(self, files: list[str]) -> list[str] | None:
        """The engine's `keys`: None (every tensor), the given keys, or the names of `files`
        the filter matches, in storage order. A non-empty filter reads the files' headers once
        more (the engine validates them again when it opens); an empty one selects nothing."""
        if self._filter is None:
            return self._keys
        if not self._filter:
            return []
        with engine_errors():
            names = torch.ops.instanttensor.tensor_names(files)
        return [name for name in names if self._matches(name)]
