"""AOTInductor packages whose weights come from safetensors checkpoints.

    # once: a package compiled without its weights
    torch._inductor.aoti_compile_and_package(torch.export.export(model, example_inputs),
        package_path="model.pt2",
        inductor_configs={"aot_inductor.package_constants_in_so": False})

    package = instanttensor.aoti.load_package("model.pt2")
    instanttensor.aoti.load_constants(package, "model.safetensors")
    outputs = package(*inputs)

    # swap while serving: load into the inactive buffer (runs go on meanwhile), then swap
    instanttensor.aoti.load_constants(package, "step-42.safetensors", use_inactive=True)
    package.swap_constant_buffer()
    package.free_inactive_constant_buffer()

`load_package` opens the package in instanttensor's engine (`torch.classes.instanttensor.
AOTIPackage`, which TorchScript can use too): the constants are checked (names, dtypes, shapes)
before any byte is read and filled in place, in the package's own buffers, in one pass.
`load_constants` also takes torch's own `torch._inductor.aoti_load_package(...)` object, with
`unchecked=True` only: torch's Python binding exposes neither the constants' dtypes and shapes
nor the package's buffers nor a swap, so there only the names are checked, the tensors are read
once into memory of their own that the package then uses as is (`user_managed=True`, kept alive
on the object; torch never releases the weights a reload replaces), and `use_inactive` is refused.
A dtype or shape that differs reaches kernels compiled for the package's: open the package with
`load_package` instead.
"""

from __future__ import annotations

import os
from typing import Any, Callable, NamedTuple, Sequence

import torch
import torch.utils._pytree as pytree

from ._errors import SafetensorKeyError, SafetensorValueError, engine_errors
from ._paths import PathLike


class ConstantsReport(NamedTuple):
    constants: list[str]  # FQNs filled, sorted
    unused_tensors: list[str]  # checkpoint tensors no constant takes (strict=False), sorted
    bytes: int  # bytes written into the package's constants


class Package:
    """An AOTInductor package (.pt2) opened by instanttensor: callable like torch's
    `aoti_load_package` object, with `load_constants`, `swap_constant_buffer` and
    `free_inactive_constant_buffer`. `handle` is the `torch.classes.instanttensor.AOTIPackage`
    (for TorchScript). Calls run without the GIL: one thread may serve while another loads the
    inactive buffer."""

    def __init__(self, path: PathLike, model_name: str = "model", device_index: int = -1):
        with engine_errors():
            self.handle = torch.classes.instanttensor.AOTIPackage(
                os.fspath(path), model_name, device_index)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        in_spec, out_spec = (pytree.treespec_loads(s) for s in self.handle.get_call_spec())
        flat = pytree.tree_flatten((args, _reorder_kwargs(kwargs, in_spec)))[0]
        outputs = self.run([x for x in flat if isinstance(x, torch.Tensor)])
        return pytree.tree_unflatten(outputs, out_spec)

    def run(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """The model on flat input tensors; its flat outputs."""
        return self.handle.run(inputs)

    def load_constants(self, files: PathLike | Sequence[PathLike], **options: Any
                       ) -> ConstantsReport:
        """`instanttensor.aoti.load_constants(self, files, **options)`."""
        return load_constants(self, files, **options)

    def swap_constant_buffer(self) -> None:
        """The inactive buffer becomes the active one (waits for runs underway)."""
        self.handle.swap_constant_buffer()

    def free_inactive_constant_buffer(self) -> None:
        self.handle.free_inactive_constant_buffer()

    def get_constant_fqns(self) -> list[str]:
        return self.handle.get_constant_fqns()

    def get_metadata(self) -> dict[str, str]:
        return dict(self.handle.get_metadata())


def load_package(path: PathLike, model_name: str = "model", device_index: int = -1) -> Package:
    """Opens a package compiled with `aot_inductor.package_constants_in_so=False`; its constants
    are empty until `load_constants`."""
    return Package(path, model_name, device_index)


def load_constants(package: Any, files: PathLike | Sequence[PathLike], *, prefix: str = "",
                   rename: Callable[[str], str] | None = None, strict: bool = True,
                   use_inactive: bool = False, backend: str | None = None,
                   concurrency: int | None = None, staging_size: int | None = None,
                   unchecked: bool = False) -> ConstantsReport:
    """Fills `package`'s constants from safetensors `files` (one path or a list), reading only
    their bytes, once.

    A constant's checkpoint name is `prefix + fqn`, or `rename(fqn)`. Before any byte is read: a
    constant without a tensor is a KeyError, so is a tensor no constant takes when `strict`; a
    dtype or shape that differs from the package's is a ValueError naming the constant and file;
    so is a package compiled with its constants inside. `use_inactive=True` fills the inactive
    buffer for `swap_constant_buffer()` while the active one keeps serving; a failure then frees
    it and leaves the active one untouched. A failed load into the active buffer leaves the
    package refusing to run until a load succeeds (never partial weights).
    `package`: a `Package` (from `load_package`), or torch's `aoti_load_package` object with
    `unchecked=True` (names checked only: see the module's documentation).
    """
    paths = [os.fspath(files)] if isinstance(files, (str, os.PathLike)) else [
        os.fspath(f) for f in files]
    if isinstance(package, Package):
        names = None
        if rename is not None:
            names = {fqn: rename(fqn) for fqn in package.get_constant_fqns()}
        with engine_errors():
            constants, unused, nbytes = package.handle.load_constants(
                paths, prefix, names, strict, use_inactive, backend, concurrency, staging_size)
        return ConstantsReport(list(constants), list(unused), int(nbytes))
    if hasattr(package, "loader") and hasattr(package, "load_constants"):
        if not unchecked:
            raise SafetensorValueError(
                "torch's aoti_load_package object states no dtypes or shapes of its constants, "
                "so they cannot be checked: open the package with "
                "instanttensor.aoti.load_package(path), or pass unchecked=True (names checked "
                "only)")
        return _load_into_torch_package(package, paths, prefix, rename, strict, use_inactive,
                                        backend)
    raise SafetensorValueError(
        f"load_constants takes instanttensor.aoti.load_package(...) or "
        f"torch._inductor.aoti_load_package(...), not {type(package).__name__}")


def _load_into_torch_package(package: Any, paths: list[str], prefix: str,
                             rename: Callable[[str], str] | None, strict: bool,
                             use_inactive: bool, backend: str | None) -> ConstantsReport:
    if use_inactive:
        raise SafetensorValueError(
            "torch's aoti_load_package object has no swap_constant_buffer in Python: open the "
            "package with instanttensor.aoti.load_package for use_inactive")
    # Constants the package folds at run time come from no checkpoint; torch's binding names
    # them only by AOTInductor's prefix for them.
    fqns = sorted(f for f in package.get_constant_fqns() if not f.startswith("_FOLDED_CONST_"))
    by_fqn = {fqn: rename(fqn) if rename is not None else prefix + fqn for fqn in fqns}
    with engine_errors():
        available = set(torch.ops.instanttensor.tensor_names(paths))
    missing = [fqn for fqn, name in by_fqn.items() if name not in available]
    if missing:
        raise SafetensorKeyError(
            f"{', '.join(paths)}: {len(missing)} of the package's {len(fqns)} constants have no "
            f"tensor in the checkpoint: {missing[:8]}")
    unused = sorted(available - set(by_fqn.values()))
    if strict and unused:
        raise SafetensorKeyError(
            f"{', '.join(paths)}: {len(unused)} checkpoint tensors are no constant of the "
            f"package (strict=False leaves them unread): {unused[:8]}")
    device = torch.device(package.get_metadata().get("AOTI_DEVICE_KEY", "cpu"))
    from ._safe_open import safe_open

    with safe_open(paths, framework="pt", device=device, keys=list(by_fqn.values()),
                   backend=backend) as f:
        constants = {fqn: f.get_tensor(name) for fqn, name in by_fqn.items()}
    package.load_constants(constants, check_full_update=True, user_managed=True)
    # user_managed: the package uses these tensors' memory and the caller keeps them alive.
    package._instanttensor_constants = constants
    return ConstantsReport(fqns, unused, sum(t.nbytes for t in constants.values()))


def _reorder_kwargs(kwargs: dict[str, Any], in_spec: Any) -> dict[str, Any]:
    """kwargs in the order the package was exported with (as torch's AOTICompiledModel does)."""
    if not kwargs:
        return {}
    order = in_spec.children_specs[1].context
    return {key: kwargs[key] for key in order}
