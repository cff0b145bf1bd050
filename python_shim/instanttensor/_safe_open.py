"""safe_open: the upstream InstantTensor API and safetensors' safe_open on one engine."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Sequence

import torch

from ._destinations import LoadIntoResult, destination_lists
from ._device import DeviceLike, free_memory_share
from ._engine_reports import engine_stats, timeline_events
from ._errors import SafetensorValueError, engine_errors, translate_error
from ._frameworks import as_framework, framework_of
from ._open_arguments import engine_arguments, file_list, open_target, refuse_missing_files
from ._selection import Selection
from ._tensor_metadata import known_metadata, metadata_of
from ._paths import PathLike

if TYPE_CHECKING:  # imported by get_slice on first use: `import instanttensor` stays cheap
    from ._slicing import SafeSlice


class safe_open:  # noqa: N801 - the name both peer APIs use
    """Opens one or many safetensors files (sorted by name) and validates them up front.

    Drop-in for upstream InstantTensor's and safetensors' `safe_open`:

        with safe_open(files, framework="pt", device="cpu") as f:
            for name, tensor in f.tensors():      # storage order, pipelined, repeatable
                ...
            w = f.get_tensor("lm_head.weight")    # random access, owned
            part = f.get_slice("embed")[0:128]    # reads only those rows

    copy=True (default): every tensor owns exactly its bytes and outlives the context (host: a
    view kept past its step is leased, stats()["leased_views"]; README, "copy=True").
    copy=False: zero-copy views (host: of the page cache; else of a bounded buffer) valid until
    the iteration advances; one still referenced then (a buffer: when its memory is needed) is
    copied out (stats()["materializations"]), so kept tensors never change; pointers exported
    earlier (data_ptr(), DLPack, numpy) keep pointing at the old memory.

    Accelerators (device="cuda", "cuda:1", 1, ...): reads land in a small pinned staging ring
    and are copied to the device on the loader's own stream; the consumer's stream waits on an
    event, never the host. copy=False borrows from a device ring of buffer_size bytes. The
    device memory used stays within max_free_mem_usage (default 0.5) of the free memory; a
    tensor larger than that is a ValueError naming it, or with host_fallback=True a CPU tensor.

    process_group: every rank gets every tensor; exchange="auto" (INSTANTTENSOR_EXCHANGE)
    exchanges bytes for device targets only, "always"/"never" override it on every rank;
    stats()["exchange"] says which and why. A failure on one rank raises on all.

    Errors: FileNotFoundError / PermissionError / OSError for I/O, ValueError for malformed
    files and bad arguments or environment values, KeyError for unknown names; each message
    names the file and the tensor.
    """

    def __init__(
        self,
        filename: PathLike | Sequence[PathLike],
        framework: str = "pt",
        device: DeviceLike = "cpu",
        process_group: Any = None,
        *,
        copy: bool = True,
        keys: Sequence[str] | None = None,
        buffer_size: int | None = None,
        chunk_size: int | None = None,
        concurrency: int | None = None,
        io_depth: int | None = None,
        max_free_mem_usage: float | None = None,
        backend: Any = None,
        load_now: bool = True,
        tensor_filter: list[str] | None = None,
        tensor_name_match_mode: str = "glob",
        host_fallback: bool = False,
        staging_size: int | None = None,
        exchange: str | None = None,
        _force_staging: bool = False,
    ) -> None:
        self._handle = None
        self._known_metadata: dict[str, tuple[torch.dtype, torch.Size]] | None = None
        self._closed = False
        self._framework = framework_of(framework)
        free_memory_share(max_free_mem_usage)  # validated for every target, before any I/O
        self._selection = Selection(keys, tensor_filter, tensor_name_match_mode)  # before I/O
        self._files = file_list(filename)
        target = open_target(device, self._framework)
        self._device, self._meta, self._device_error = target
        self.copy: bool = bool(copy)
        self.load_now = load_now
        self._open_arguments = engine_arguments(
            copy=copy, buffer_size=buffer_size, chunk_size=chunk_size, concurrency=concurrency,
            io_depth=io_depth, backend=backend, process_group=process_group,
            staging_size=staging_size, max_free_mem_usage=max_free_mem_usage,
            host_fallback=host_fallback, force_staging=_force_staging, exchange=exchange)
        if load_now:
            self._open(stacklevel=3)
        # load_now=False (upstream): files are opened and validated at __enter__ or first use.

    def _open(self, stacklevel: int = 2) -> None:
        refuse_missing_files(self._files)
        keys = self._selection.keys_of(self._files)
        with engine_errors():
            handle = torch.classes.instanttensor.Loader(self._files, self._device, keys=keys,
                                                        **self._open_arguments)
            for message in handle.open_warnings():
                warnings.warn(message, stacklevel=stacklevel + 1)
        self._handle = handle

    def _engine(self) -> Any:
        """The open engine handle, opening now if load_now=False deferred it; SafetensorError
        (also ValueError) once the handle is closed."""
        if self._closed:
            raise SafetensorValueError(f"File is closed: safe_open({self._files[0]!r}, ...)")
        if self._handle is None:
            self._open(stacklevel=3)
        return self._handle

    def _data_engine(self) -> Any:
        """The engine, for a call that moves tensor bytes: also raises the target's error when
        the device was not reachable at open."""
        engine = self._engine()
        if self._device_error is not None:  # a new exception each time: no growing traceback
            raise type(self._device_error)(*self._device_error.args)
        return engine

    # Read on demand: each call into the engine costs microseconds that add up over many opens.
    @property
    def total_tensor_size(self) -> int:
        """Bytes of the selected tensors."""
        with engine_errors():
            return self._engine().total_tensor_size()

    @property
    def buffer_size(self) -> int:
        """Pool bytes (copy=False) or read-ahead budget (copy=True)."""
        with engine_errors():
            return self._engine().buffer_size()

    @property
    def file_metadata(self) -> dict[str, str] | None:
        """Upstream's attribute (ComfyUI reads it): the same as metadata()."""
        return self.metadata()

    # -- context manager -------------------------------------------------------------------
    def __enter__(self) -> "safe_open":
        self._engine()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def close(self) -> None:
        """Releases threads, fds and buffers; borrowed tensors still referenced are copied out.
        Every method but stats() then raises "File is closed"; closing again does nothing."""
        self._closed = True
        if self._handle is not None:
            with engine_errors():
                self._handle.close()

    # -- names and metadata ----------------------------------------------------------------
    def keys(self) -> list[str]:
        """Selected tensor names, sorted (as safetensors)."""
        with engine_errors():
            return list(self._engine().keys())

    def offset_keys(self) -> list[str]:
        """Selected tensor names in storage order (files sorted, then by offset)."""
        with engine_errors():
            return list(self._engine().offset_keys())

    def metadata(self) -> dict[str, str] | None:
        """The files' __metadata__, or None when no file has one (as safetensors)."""
        with engine_errors():
            if not self._engine().has_metadata():
                return None
            return dict(self._engine().metadata())

    def get_tensor_metadata(self, name: str) -> tuple[torch.dtype, torch.Size]:
        """(dtype, shape) of a tensor without reading its data."""
        engine = self._engine()  # also what raises once closed
        if self._known_metadata is None:
            self._known_metadata = known_metadata(engine)
        return self._known_metadata.get(name) or metadata_of(engine, name)

    # -- data ------------------------------------------------------------------------------
    def tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(name, tensor) in storage order; every call starts a new pass (at its first item)."""
        if self._meta or self._framework != "pt":
            return self._converted_pass()
        return self._engine_pass()  # itself: no generator layer between it and the consumer

    def _engine_pass(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The engine's pass: tensors (views of the page cache, borrowed or owned as the mode
        says) in storage order."""
        with engine_errors():
            self._data_engine().restart()
        step = self._engine().next
        while True:
            try:  # not engine_errors(): a context manager per tensor costs more than small reads
                item = step()
            except RuntimeError as error:
                mapped = translate_error(error)
                if mapped is error:
                    raise
                raise mapped from None
            if item is None:
                return
            name, tensor = item
            del item
            yield name, tensor
            del tensor  # the consumer now owns the only reference this frame had

    def _converted_pass(self) -> Iterator[tuple[str, Any]]:
        """tensors() for meta targets (shapes only) and numpy: streamed, each array owning a copy
        of its bytes, made while the pass is at its tensor (a numpy array is an exported pointer,
        which a view kept past its step could not follow), the view dropped at once."""
        if self._meta:
            for name in self.offset_keys():
                yield name, self._tensor(name)
            return
        for name, tensor in self._engine_pass():
            owned = tensor.clone()
            del tensor
            yield name, as_framework(owned, self._framework, name)

    def _all_tensors(self) -> dict[str, torch.Tensor]:
        """Every selected tensor as torch tensors, in storage order (load_file's one pass)."""
        return dict(self._converted_pass() if self._meta else self._engine_pass())

    def get_tensors(self) -> dict[str, Any]:
        """Every selected tensor, owned, by name in storage order (the reference's get_tensors;
        one pipelined pass)."""
        return dict(self.tensors())

    def get_tensor(self, name: str) -> Any:
        """An owned tensor (a numpy array for framework="np"), in any order, any number of
        times."""
        return as_framework(self._tensor(name), self._framework, name)

    def _tensor(self, name: str) -> torch.Tensor:
        if self._meta:
            dtype, shape = self.get_tensor_metadata(name)
            return torch.empty(shape, dtype=dtype, device="meta")
        with engine_errors():
            return self._data_engine().get_tensor(name)

    def get_slice(self, name: str) -> SafeSlice:
        """A lazy slice object (safetensors API); indexing reads only the needed rows."""
        from ._slicing import SafeSlice  # noqa: F811
        self._engine()  # here, so a deferred open's warnings name the caller's line
        return SafeSlice(self, name)

    def load_into(self, destinations: Mapping[str, torch.Tensor], *,
                  strict: bool = True) -> LoadIntoResult:
        """Fills tensors you own (a model's `state_dict()` works) in place, in one pass.

        Each destination receives the selected tensor of the same name: CPU tensors are read
        straight into (O_DIRECT where their address and the file offset agree modulo the block),
        accelerator tensors through the pinned staging ring with no device allocation. Before any
        byte is written: ValueError for a dtype or shape that differs from the file's, or for
        destinations that overlap themselves or each other; KeyError listing the names found on
        one side only, unless strict=False, which fills what both sides have and returns the rest
        as (missing_keys, unexpected_keys), like `Module.load_state_dict`.
        """
        names, tensors = destination_lists(destinations)
        with engine_errors():
            missing, unexpected = self._engine().load_into(names, tensors, bool(strict))
        return LoadIntoResult(list(missing), list(unexpected))

    def _rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        with engine_errors():
            return self._data_engine().get_rows(name, start, stop)

    def stats(self) -> dict[str, Any]:
        """Counters since open: bytes_read, read_requests, materializations, timings, backend,
        exchange (whether a process group exchanged bytes, and why), staging (the staging ring's
        memory: "pinned"; "pinned, smaller (...)" or "pageable (pinning refused: ...)" where the
        platform refused to pin it all), advice_refused (memory advice the kernel refused: the
        load went on), read_bytes (bytes per read request: chunk_size, or for warm reads into a
        staging ring a slice fitted to the CPU's last-level cache). After close() still answers
        with the final counts."""
        with engine_errors():
            return engine_stats(self._engine_or_final())

    def timeline(self) -> list[dict[str, Any]]:
        """What the loader's stages did when (reads, staging slices, copies, waits), recorded
        when INSTANTTENSOR_TIMELINE=1 was set at open (else empty): dicts of kind, start, end
        (time.monotonic seconds), bytes, tag. benchmarks/device_pipeline.py --timeline plots it."""
        with engine_errors():
            return timeline_events(self._engine_or_final())

    def _engine_or_final(self) -> Any:
        """The engine; after close() of an opened handle, the closed one (its final figures)."""
        return self._handle if self._closed and self._handle is not None else self._engine()

    def __del__(self) -> None:
        handle = getattr(self, "_handle", None)
        if handle is not None:
            try:
                handle.close()
            except Exception:  # noqa: BLE001 - nothing to report to from a finalizer
                pass
