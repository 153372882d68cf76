"""The device watch (tests/device_watch.py) catches, on CPU, the tensors a kernel would put on the wrong device
on a GPU: a planted offender fails the run naming the factory and the line; tensors made on the inputs' device
pass; a kernel that swallows the error cannot hide it."""

from __future__ import annotations

import contextlib
import re

import device_watch
import pytest
import torch

from pytest_ortdiff import TorchEvaluator, models

DIMS = {"a": 1, "b": 2, "c": 4}


def _run(matmul: object) -> list[torch.Tensor]:
    model = models.layer_norm_matmul_add(dtype="float32")
    return TorchEvaluator(model, kernels={("", "MatMul"): matmul}).run(None, models.random_feeds(model, dims=DIMS, seed=0))


def test_the_suite_runs_with_the_watch_on() -> None:
    assert device_watch.enabled(), "ORTDIFF_DEVICE_WATCH=0 turned the watch off"
    assert TorchEvaluator.run.__module__ == "device_watch"


@pytest.mark.parametrize(
    ("make", "factory"),
    [
        (lambda a: torch.zeros(a.shape[-1]), "torch.zeros"),
        (lambda a: torch.tensor([1.0, 2.0]), "torch.tensor"),
        (lambda a: torch.arange(4), "torch.arange"),
        (lambda a: torch.full((2,), 0.5, dtype=a.dtype), "torch.full"),
        (lambda a: torch.eye(2, dtype=a.dtype), "torch.eye"),
    ],
    ids=["zeros", "tensor", "arange", "full-with-dtype-only", "eye"],
)
def test_a_tensor_made_without_the_runs_device_fails_the_run_naming_it(make: object, factory: str) -> None:
    def offender(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        make(a)  # type: ignore[operator]
        return a @ b

    with pytest.raises(RuntimeError) as info:
        _run(offender)
    text = f"{info.value} {info.value.__cause__}"
    assert f"device watch: {factory}(" in text
    assert re.search(r"at .*test_device_watch\.py:\d+ \(<lambda>\)", text), text


def test_a_kernel_that_swallows_the_error_is_caught_when_the_run_ends() -> None:
    def swallowing(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        with contextlib.suppress(Exception):  # (a kernel falling back on any error)
            torch.ones(3)
        return a @ b

    with pytest.raises(device_watch.DeviceWatchError, match=r"device watch: torch\.ones\(\.\.\.\) made a tensor without device="):
        _run(swallowing)


def test_tensors_on_the_inputs_device_pass() -> None:
    def good(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        z = torch.zeros(a.shape[-1], device=a.device)
        t = torch.as_tensor(a)  # (of a tensor: its device)
        return a @ b + z.sum() + torch.zeros_like(a).sum() + a.new_zeros(()) + t.sum() * 0

    (z,) = _run(good)
    model = models.layer_norm_matmul_add(dtype="float32")
    (plain,) = TorchEvaluator(model).run(None, models.random_feeds(model, dims=DIMS, seed=0))
    torch.testing.assert_close(z, plain, rtol=0, atol=0)


def test_the_switch_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(device_watch.ENV, "0")
    assert not device_watch.enabled()
    monkeypatch.setenv(device_watch.ENV, "1")
    assert device_watch.enabled()
