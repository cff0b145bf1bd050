"""Upstream InstantTensor's backend enums, and `backend=` as the engine takes it.

Upstream 0.2.2 callers (SGLang turns names into members through `Backend.__members__` and
`BackendPolicy.__members__`) pass a member or a list of members; our own callers pass a name or a
comma list of names. Both become one comma list for the engine, which maps upstream's names onto
ours (ops/loader/options.cpp): AIO -> the O_DIRECT pread pool, AIO_BUFFERED -> the buffered pread
pool, URING -> io_uring on O_DIRECT, URING_BUFFERED -> io_uring through the page cache, MMAP -> the
mmap backend, BUFFERED -> page-cache reads (the buffered pread pool), CUFILE -> skipped (GPUDirect
Storage is not built), so the next candidate is used.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from ._errors import SafetensorTypeError, SafetensorValueError


class Backend(Enum):
    """A read backend, by upstream's name; the value is the name the engine takes."""

    AIO = "AIO"
    AIO_BUFFERED = "AIO_BUFFERED"
    URING = "URING"
    URING_BUFFERED = "URING_BUFFERED"
    CUFILE = "CUFILE"
    MMAP = "MMAP"


class BackendPolicy(Enum):
    """A named chain of backends (upstream: BUFFERED reads through the page cache)."""

    BUFFERED = "BUFFERED"


def backend_argument(backend: Any) -> str | None:
    """`backend=` as a comma list for the engine, candidates in the caller's order.

    Accepts None (the engine's choice, or INSTANTTENSOR_BACKEND), a Backend or BackendPolicy
    member, a name or comma list of names (ours or upstream's), or a list or tuple of members
    and names. An empty list is a ValueError (as upstream); anything else is a TypeError.
    Unknown names are rejected by the engine with the accepted list.
    """
    if backend is None:
        return None
    candidates = [backend] if isinstance(backend, (str, Backend, BackendPolicy)) else backend
    if not isinstance(candidates, (list, tuple)):
        raise SafetensorTypeError("backend must be a Backend, a BackendPolicy, a name, or a list of them; "
                        f"got {type(backend).__name__}")
    if not candidates:
        raise SafetensorValueError("backend cannot be an empty list; use None for the default choice")
    names = []
    for candidate in candidates:
        if isinstance(candidate, (Backend, BackendPolicy)):
            names.append(candidate.value)
        elif isinstance(candidate, str):
            names.append(candidate)
        else:
            raise SafetensorTypeError("backend must be a Backend, a BackendPolicy, a name, or a list of "
                            f"them; got {type(candidate).__name__} in the list")
    return ",".join(names)
