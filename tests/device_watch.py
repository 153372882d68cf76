"""Device watch: an evaluator run fails on a tensor made without the run's device.

On a GPU, a kernel that makes a tensor with `torch.zeros(n)` (no `device=`) puts it on the CPU, and the next op
mixing it with CUDA tensors fails ("Expected all tensors to be on the same device"). CPU CI never sees that:
everything is on the CPU there. Watching the factory calls themselves does: during `TorchEvaluator.run`, a
factory call (torch.zeros, torch.tensor, torch.arange, ...) without `device=` is a violation, raised where it
happens and again when the run ends (a kernel that catches errors cannot hide it). An explicit device, even
the CPU on a GPU run, is a choice a reviewer sees (host-side loops that move their result) and passes. `*_like` factories and methods of a tensor (`x.new_zeros`) take the
tensor's device and are not watched; neither are `torch.from_numpy`/`torch.frombuffer`, whose tensors are
CPU by definition and must be moved explicitly (`.to(x.device)`, which a reviewer sees).

The test suite turns it on for every evaluator run (tests/conftest.py; `ORTDIFF_DEVICE_WATCH=0` turns it
off), so the kernel harness and the real exports are watched on every CI run.
"""

from __future__ import annotations

import contextlib
import os
import threading
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["ENV", "DeviceWatch", "DeviceWatchError", "enabled", "watching"]

#: the environment variable that turns the watch off in the suite ("0")
ENV = "ORTDIFF_DEVICE_WATCH"


class DeviceWatchError(RuntimeError):
    """A tensor was made without the run's device during a watched evaluator run."""


def _factories() -> dict[Callable[..., Any], str]:
    names = [
        "zeros", "ones", "full", "empty", "empty_strided", "arange", "range", "tensor", "as_tensor", "scalar_tensor",
        "eye", "linspace", "logspace", "rand", "randn", "randint", "randperm", "normal", "tril_indices", "triu_indices",
        "bartlett_window", "blackman_window", "hamming_window", "hann_window", "kaiser_window", "sparse_coo_tensor",
        "asarray", "complex", "polar",
    ]
    out: dict[Callable[..., Any], str] = {}
    for name in names:
        fn = getattr(torch, name, None)
        if fn is not None and name not in ("complex", "polar", "normal"):  # (complex/polar/normal of tensors: no new device)
            out[fn] = f"torch.{name}"
    return out


FACTORIES = _factories()
# a factory of existing tensors keeps their device: torch.tensor(t) / torch.as_tensor(t) / torch.asarray(t)
_OF_DATA = {torch.tensor, torch.as_tensor, getattr(torch, "asarray", torch.as_tensor)}
_HERE = os.path.dirname(os.path.abspath(__file__))
_TORCH = os.path.dirname(os.path.abspath(torch.__file__))


def _caller() -> str:
    """The first frame outside torch and this module: the kernel's line that made the tensor."""
    for frame in reversed(traceback.extract_stack()[:-3]):
        path = os.path.abspath(frame.filename)
        if not path.startswith(_TORCH) and path != os.path.abspath(__file__):
            return f"{frame.filename}:{frame.lineno} ({frame.name})"
    return "?"


def _holds_tensor(x: Any) -> bool:
    if isinstance(x, torch.Tensor):
        return True
    if isinstance(x, list | tuple) and x:
        return all(_holds_tensor(v) for v in x)
    return False


class DeviceWatch(TorchFunctionMode):
    """The watch for one run on `device`; `violations` lists what it saw."""

    def __init__(self, device: torch.device | str) -> None:
        super().__init__()
        self.device = torch.device(device)
        self.violations: list[str] = []

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        name = FACTORIES.get(func)
        if name is not None:
            problem = self._problem(func, name, args, kwargs)
            if problem is not None:
                self.violations.append(problem)
                raise DeviceWatchError(problem)
        return func(*args, **kwargs)

    def _problem(self, func: Any, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
        device = kwargs.get("device")
        if device is None:
            if func in _OF_DATA and args and _holds_tensor(args[0]):
                return None  # (a tensor's own device)
            return (
                f"device watch: {name}(...) made a tensor without device= during a TorchEvaluator run on {self.device} "
                f"at {_caller()}: on a GPU it would be on the CPU; pass device= (the inputs' device, e.g. device=x.device)"
            )
        # an explicit device is a choice a reviewer sees (a kernel computing on the host on purpose, as
        # NonMaxSuppression's loop does, then moving its result): only the implicit default is watched
        return None

    def check(self) -> None:
        """Raise the first violation, if any (one a kernel caught and handled is still one)."""
        if self.violations:
            more = f" (and {len(self.violations) - 1} more)" if len(self.violations) > 1 else ""
            raise DeviceWatchError(self.violations[0] + more)


def enabled() -> bool:
    return os.environ.get(ENV, "1").strip() not in ("0", "false", "no", "off")


@contextlib.contextmanager
def watching() -> Iterator[None]:
    """Every `TorchEvaluator.run` inside is watched (the suite's conftest keeps this on for the session)."""
    from pytest_ortdiff.runtimes.evaluator import TorchEvaluator

    original = TorchEvaluator.run

    def run(self: TorchEvaluator, *args: Any, **kwargs: Any) -> Any:
        if getattr(_STATE, "depth", 0):  # (a run inside a run, e.g. a Subgraph's: the outer watch holds)
            return original(self, *args, **kwargs)
        _STATE.depth = 1
        try:
            with DeviceWatch(self.device) as watch:
                out = original(self, *args, **kwargs)
        finally:
            _STATE.depth = 0
        watch.check()
        return out

    run.__doc__ = original.__doc__
    TorchEvaluator.run = run  # type: ignore[method-assign]
    try:
        yield
    finally:
        TorchEvaluator.run = original  # type: ignore[method-assign]


_STATE = threading.local()  # depth of watched runs on this thread (a mode is per thread too)
