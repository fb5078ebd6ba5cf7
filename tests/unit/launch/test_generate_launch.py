"""The library half of ``lightning-kd generate``: what it says of settings it does not use."""

from __future__ import annotations

from lightning_kd.launch.config import compose_config
from lightning_kd.launch.generate import one_process_note


def test_several_processes_asked_of_generate_are_named_as_not_used() -> None:
    """`generate strategy=ddp trainer.devices=2` ran one process without a word (probe 26)."""
    assert one_process_note(compose_config(["debug=smoke"])) is None
    note = one_process_note(compose_config(["debug=smoke", "strategy=ddp", "trainer.devices=2"]))
    assert note == (
        "generate: one process writes the completions (trainer.strategy, trainer.devices=2: for "
        "train and cache, not here)"
    )
    nodes = one_process_note(compose_config(["debug=smoke", "trainer.num_nodes=2"]))
    assert nodes is not None and "(trainer.num_nodes=2: for train and cache" in nodes
