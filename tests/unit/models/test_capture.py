"""The capture lifecycle on a plain PyTorch model: arm, pop, clear, errors."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from torch import nn

from lightning_kd.models.capture import CaptureError, ModuleCapture, capture_step


class TwoLayers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(4, 4)
        self.second = nn.Linear(4, 4)
        self.unused = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, twice: bool = False) -> torch.Tensor:
        x = self.first(x)
        if twice:
            x = self.first(x)
        return self.second(x)


def test_records_only_while_armed_and_pop_clears() -> None:
    model = TwoLayers()
    capture = ModuleCapture(model, ["first", "second"], "student")
    x = torch.randn(2, 4)
    model(x)  # outside a step: nothing recorded
    assert capture.records == {}
    with capture.arm():
        out = model(x)
    assert not capture.armed
    model(x)  # after disarming: still exactly one record each
    outputs = capture.pop()
    torch.testing.assert_close(outputs["second"], out)
    assert capture.records == {}


def test_module_that_never_ran_is_an_error() -> None:
    model = TwoLayers()
    capture = ModuleCapture(model, ["first", "unused"], "student")
    with capture.arm():
        model(torch.randn(1, 4))
    with pytest.raises(CaptureError, match=r"student modules \['unused'\] did not run"):
        capture.pop()
    assert capture.records == {}, "a failed pop still clears"


def test_module_recorded_twice_is_an_error() -> None:
    model = TwoLayers()
    capture = ModuleCapture(model, ["first"], "teacher")
    with capture.arm():
        model(torch.randn(1, 4), twice=True)
    with pytest.raises(CaptureError, match=r"teacher modules \['first'\] ran more than once"):
        capture.pop()


def test_unread_capture_at_step_end_is_an_error() -> None:
    model = TwoLayers()
    capture = ModuleCapture(model, ["first"], "student")
    with pytest.raises(CaptureError, match="never read by the loss"), capture_step(capture):  # noqa: SIM117
        with capture.arm():
            model(torch.randn(1, 4))
        # ... and then a loss that forgets the feature term
    assert capture.records == {}


def test_exception_in_step_clears_and_propagates() -> None:
    model = TwoLayers()
    capture = ModuleCapture(model, ["first"], "student")
    with pytest.raises(ZeroDivisionError), capture_step(capture), capture.arm():
        model(torch.randn(1, 4))
        _ = 1 / 0
    assert capture.records == {} and not capture.armed


def test_remove_restores_the_model() -> None:
    model = TwoLayers()
    before = {name: dict(m._forward_hooks) for name, m in model.named_modules()}
    capture = ModuleCapture(model, ["first", "second"], "student")
    assert len(model.first._forward_hooks) == 1
    capture.remove()
    assert {name: dict(m._forward_hooks) for name, m in model.named_modules()} == before


def test_unknown_path_lists_nearest_paths() -> None:
    with pytest.raises(CaptureError, match=r"no module 'secnod'; nearest valid paths: \['second'"):
        ModuleCapture(TwoLayers(), ["secnod"], "student")


def test_arming_twice_is_an_error() -> None:
    capture = ModuleCapture(TwoLayers(), ["first"], "student")
    with pytest.raises(CaptureError, match="already armed"), capture.arm(), capture.arm():
        pass


def test_stripped_hooks_are_put_back() -> None:
    """As DeepSpeed's inference setup does: every forward hook removed behind our back."""
    model = TwoLayers()
    capture = ModuleCapture(model, ["first", "second"], "student")
    for module in model.modules():
        module._forward_hooks.clear()
    capture.ensure_attached()
    capture.ensure_attached()  # idempotent: one hook per module
    assert len(model.first._forward_hooks) == len(model.second._forward_hooks) == 1
    with capture.arm():
        model(torch.randn(1, 4))
    assert sorted(capture.pop()) == ["first", "second"]


class Holder(nn.Module):
    """A model and its capture, as a distiller holds them."""

    def __init__(self) -> None:
        super().__init__()
        self.model = TwoLayers()
        self.capture = ModuleCapture(self.model, ["first", "second"], "student")


def test_a_copy_records_into_its_own_capture_and_pickles() -> None:
    """The hooks were closures over the original capture: a deepcopy's armed forward recorded
    into the original's, the copy's pop found its modules "did not run", and pickling failed."""
    original = Holder()
    twin = copy.deepcopy(original)
    x = torch.randn(2, 4)
    with twin.capture.arm():
        out = twin.model(x)
    assert original.capture.records == {}
    torch.testing.assert_close(twin.capture.pop()["second"], out)
    loaded = pickle.loads(pickle.dumps(original))
    with loaded.capture.arm():
        loaded.model(x)
    assert set(loaded.capture.pop()) == {"first", "second"}
    twin.capture.remove()  # the copy's hooks only
    assert twin.model.first._forward_hooks == {} and original.model.first._forward_hooks
    with original.capture.arm():
        original.model(x)
    assert set(original.capture.pop()) == {"first", "second"}
