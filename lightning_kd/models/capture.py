"""Forward hooks that capture named modules' outputs, with a lifecycle that cannot go wrong.

The rules (``docs/features.md``, "The capture lifecycle"):

1. Hooks are registered once per model (:class:`ModuleCapture`), not per step;
   :meth:`ModuleCapture.remove` takes every one of them off again, and
   :meth:`ModuleCapture.ensure_attached` puts back any that a strategy stripped.
2. A hook records only while its capture is *armed*. The step arms a capture around its own
   forward and disarms it right after, so a forward outside a step — and the re-forward that
   activation checkpointing runs during backward — record nothing.
3. :meth:`ModuleCapture.pop` reads and clears every record. A configured module that did not run,
   or ran twice in one armed forward, is a :class:`CaptureError` naming it: never a silent loss
   without its feature term.
4. :func:`capture_step` wraps a whole step: whatever happens, records are cleared when it ends, and
   a step that ends normally with a record nobody read is an error (a loss that forgot its feature
   term), not a warning on every micro-batch.

This module knows torch modules and hooks, not Lightning: a plain PyTorch loop can use it too.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from contextlib import contextmanager

from torch import Tensor, nn

from lightning_kd.utils.refusal import Refused


class CaptureError(RuntimeError):
    """A capture was misused: armed twice, or records nobody read (the library's caller's to
    fix); :class:`ModuleChoiceError` for a configured module that cannot serve."""


class ModuleChoiceError(CaptureError, Refused):
    """A module ``distill.features`` names that cannot serve: absent, of another width, with no
    tensor output, or not run exactly once per forward. The user's value to change, so refused
    as every bad value is (exit 2 with the message alone), not a traceback after loading."""


def resolve_module(model: nn.Module, path: str, role: str) -> nn.Module:
    """``model.get_submodule(path)``, or an error listing the nearest valid paths."""
    try:
        return model.get_submodule(path)
    except AttributeError:
        names = [name for name, _ in model.named_modules() if name]
        nearest = difflib.get_close_matches(path, names, n=5, cutoff=0.0)
        raise ModuleChoiceError(
            f"the {role} ({type(model).__name__}) has no module {path!r}; nearest valid paths: "
            f"{nearest}"
        ) from None


def first_tensor(output: object) -> Tensor:
    """The main tensor of a module's output (decoder layers may return tuples or ModelOutputs)."""
    if isinstance(output, Tensor):
        return output
    if isinstance(output, tuple | list) and output and isinstance(output[0], Tensor):
        return output[0]
    if hasattr(output, "to_tuple"):
        return first_tensor(output.to_tuple())
    raise ModuleChoiceError(f"cannot capture a module output of type {type(output).__name__}")


class Recorder:
    """The hook on one module: its output joins ``capture``'s records while the capture is armed.
    An object, not a closure: a copied distiller's hooks are then bound to the copy's capture
    (``copy.deepcopy`` maps them through its memo; a closure kept recording into the original's,
    and the copy's first step found its modules "did not run"), and a distiller pickles."""

    def __init__(self, capture: ModuleCapture, path: str) -> None:
        self.capture, self.path = capture, path

    def __call__(self, module: nn.Module, args: tuple, output: object) -> None:
        if self.capture.armed:
            self.capture.records.setdefault(self.path, []).append(first_tensor(output))


class ModuleCapture:
    """Forward hooks on ``paths`` of one model, recording outputs only while armed."""

    def __init__(self, model: nn.Module, paths: list[str], role: str) -> None:
        self.role = role
        self.paths = list(dict.fromkeys(paths))  # a module shared by several pairs: one hook
        self.armed = False
        self.records: dict[str, list[Tensor]] = {}
        self._modules = {path: resolve_module(model, path, role) for path in self.paths}
        # Hook ids, not torch's handles: a handle holds a weak reference to the hooked module's
        # dict, which a copy of the model would share, removing the original's hooks.
        self._hook_ids = {
            path: module.register_forward_hook(Recorder(self, path)).id
            for path, module in self._modules.items()
        }

    def ensure_attached(self) -> None:
        """Put back any hook something else took off.

        DeepSpeed's inference setup (validate/test/predict outside ``fit``) removes every module
        hook; without this the next armed forward would find nothing recorded.
        """
        for path, module in self._modules.items():
            if self._hook_ids[path] not in module._forward_hooks:
                self._hook_ids[path] = module.register_forward_hook(Recorder(self, path)).id

    @contextmanager
    def arm(self) -> Iterator[None]:
        """Record the hooked modules' outputs for the duration of the block (one forward)."""
        if self.armed:
            raise CaptureError(f"the {self.role} capture is already armed")
        self.armed = True
        try:
            yield
        finally:
            self.armed = False

    def pop(self) -> dict[str, Tensor]:
        """Every configured module's output from the last armed forward; clears the records."""
        records, self.records = self.records, {}
        missing = [path for path in self.paths if path not in records]
        repeated = [path for path, outputs in records.items() if len(outputs) > 1]
        if missing:
            raise ModuleChoiceError(
                f"{self.role} modules {missing} did not run in the armed forward, so their "
                "feature losses cannot be computed: the step runs the model's body (base_model) "
                "and the chunked loss applies the output head (lm_head) itself. Match a module "
                "inside the body (a decoder layer, the final norm) in distill.features, or set "
                "distill.chunked=false"
            )
        if repeated:
            raise ModuleChoiceError(
                f"{self.role} modules {repeated} ran more than once in one armed forward "
                "(a module reused inside the model?); capture a module that runs once"
            )
        return {path: outputs[0] for path, outputs in records.items()}

    def clear(self) -> None:
        """Drop every record without reading it."""
        self.records = {}

    def remove(self) -> None:
        """Take the hooks off the model, leaving it as it was before."""
        for path, module in self._modules.items():
            module._forward_hooks.pop(self._hook_ids[path], None)
        self._hook_ids = {}
        self._modules = {}
        self.clear()


@contextmanager
def capture_step(*captures: ModuleCapture) -> Iterator[None]:
    """One step's capture scope: records never outlive it, and an unread record is an error."""
    finished = False
    try:
        yield
        finished = True
    finally:
        unread = {c.role: sorted(c.records) for c in captures if c.records}
        for capture in captures:
            capture.armed = False
            capture.clear()
    if finished and unread:
        raise CaptureError(
            f"captured outputs {unread} were never read by the loss: the step would silently "
            "train without their feature terms"
        )
