"""Which tensors a safe_open selects: `keys=` (ours) or upstream 0.2.2's `tensor_filter=`.

A filter is a list of patterns matched against whole tensor names, case-sensitive, in one of
three modes: "glob" (fnmatchcase rules; a pattern without `*?[` is a literal name), "exact" and
"regex" (`re.fullmatch`). The matching names become the engine's `keys`, so only their bytes are
read and only they count in total_tensor_size, keys() and buffer sizing.
"""

from __future__ import annotations

import fnmatch
import re
from typing import Any, Callable, Sequence

import torch

MATCH_MODES = ("glob", "exact", "regex")


def name_matcher(patterns: Any, mode: Any) -> Callable[[str], bool]:
    """A predicate for `patterns` in `mode`. Raises ValueError for an unknown mode or a bad regex
    (naming it) and TypeError for patterns that are not a list of str (upstream's rule: a tuple,
    a set or a bare string is refused, so a typo never selects by characters)."""
    if mode not in MATCH_MODES:
        raise ValueError(f"tensor_name_match_mode={mode!r} is not valid; accepted: "
                         + ", ".join(repr(m) for m in MATCH_MODES))
    if not isinstance(patterns, list) or any(not isinstance(p, str) for p in patterns):
        raise TypeError("tensor_filter must be a list of strings (name patterns), not "
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
            raise ValueError(f"tensor_filter pattern {pattern!r} is not a valid "
                             f"{'glob' if mode == 'glob' else 'regular expression'}: "
                             f"{error}") from None
    if not compiled:
        return literal.__contains__
    return lambda name: name in literal or any(p.fullmatch(name) is not None for p in compiled)


def check_selection(keys: Any, tensor_filter: Any, match_mode: Any) -> None:
    """Raises for a bad selection before any file is opened: both `keys` and `tensor_filter`
    (ValueError), `keys` given as one string (ValueError), a bad filter or mode (see
    name_matcher; a bad mode is an error even without a filter)."""
    if keys is not None and tensor_filter is not None:
        raise ValueError("pass keys= (exact names, unknown ones are a KeyError) or tensor_filter= "
                         "(patterns), not both")
    if isinstance(keys, str):
        raise ValueError("keys must be a list of tensor names, not a string")
    name_matcher([] if tensor_filter is None else tensor_filter, match_mode)


def selected_keys(files: list[str], keys: Sequence[str] | None, tensor_filter: Any,
                  match_mode: Any) -> list[str] | None:
    """The engine's `keys`: None (every tensor), `keys` as given, or the names of `files` that
    `tensor_filter` matches, in storage order (an empty filter selects nothing). The filter reads
    the files' headers once more (the engine validates them again when it opens). Call after
    check_selection."""
    if tensor_filter is None:
        return None if keys is None else [str(k) for k in keys]
    matches = name_matcher(tensor_filter, match_mode)
    if not tensor_filter:
        return []
    from ._errors import engine_errors

    with engine_errors():
        names = torch.ops.instanttensor.tensor_names(files)
    return [name for name in names if matches(name)]
