"""Multi-node settings against the launcher that started the process, refused before loading."""

from __future__ import annotations

import pytest

from lightning_kd.launch.config import compose_config
from lightning_kd.launch.nodes import Launcher, launcher, node_errors, one_process_note

TORCHRUN_2x1 = {
    "TORCHELASTIC_RUN_ID": "none",
    "WORLD_SIZE": "2",
    "GROUP_WORLD_SIZE": "2",
    "LOCAL_WORLD_SIZE": "1",
}
SRUN_2x4 = {
    "SLURM_NTASKS": "8",
    "SLURM_NNODES": "2",
    "SLURM_NTASKS_PER_NODE": "4",
    "SLURM_STEP_ID": "0",  # srun's first step
}


def test_the_launcher_is_read_from_its_environment() -> None:
    assert launcher({}) is None
    assert launcher(TORCHRUN_2x1) == Launcher("torchrun", 2, 2, 1)
    assert launcher(SRUN_2x4) == Launcher("srun", 8, 2, 4)
    # An interactive allocation (srun --pty bash): the user starts the processes, as Lightning
    # itself treats it.
    assert launcher({**SRUN_2x4, "SLURM_JOB_NAME": "interactive"}) is None


def test_several_nodes_without_a_launcher_are_refused_with_the_command() -> None:
    (error,) = node_errors(2, 1, {})
    assert "trainer.num_nodes=2, but no multi-node launcher started this process" in error
    assert "wait forever" in error
    assert "torchrun --nnodes=2 --nproc-per-node=1 --node-rank=<0..1>" in error
    assert "hydra/launcher=submitit_slurm" in error
    assert node_errors(1, 1, {}) == [] and node_errors(1, 4, {}) == []
    assert "hydra.run.dir=<a directory every node sees> <this command's other overrides>" in error


def test_lightnings_manual_launch_is_refused_for_what_it_is() -> None:
    """MASTER_ADDR, NODE_RANK and WORLD_SIZE set by hand on each node were told Lightning
    would wait forever, which it does not; the command offered dropped the user's overrides
    (probe 35)."""
    manual = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29612", "NODE_RANK": "1"}
    (error,) = node_errors(2, 1, {**manual, "WORLD_SIZE": "2"})
    assert error.startswith("trainer.num_nodes=2 with NODE_RANK and MASTER_ADDR set by hand")
    assert "wait forever" not in error and "<this command's other overrides>" in error


@pytest.mark.parametrize(
    ("num_nodes", "devices", "environ", "expected"),
    [
        (3, 1, TORCHRUN_2x1, "trainer.num_nodes=3, but torchrun started 2 nodes (--nnodes=2)"),
        (2, 2, TORCHRUN_2x1, "trainer.devices=2, but torchrun started 1 processes per node "),
        (1, 1, {**TORCHRUN_2x1, "GROUP_WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "2"}, "--nproc"),
        (2, 2, SRUN_2x4, "set trainer.devices=4 or launch --ntasks-per-node=2"),
        (4, 4, SRUN_2x4, "but srun started 2 nodes (--nodes=2); set trainer.num_nodes=2"),
        (2, "auto", SRUN_2x4, "trainer.devices='auto' under srun: "),
    ],
    ids=["nodes", "devices", "one_node", "srun_tasks", "srun_nodes", "auto_devices"],
)
def test_a_launcher_that_disagrees_with_the_config_is_named(
    num_nodes, devices, environ, expected
) -> None:
    errors = node_errors(num_nodes, devices, environ)
    assert any(expected in error for error in errors), errors


def test_srun_without_tasks_per_node_is_checked_by_its_task_count() -> None:
    environ = {"SLURM_NTASKS": "6", "SLURM_NNODES": "2", "SLURM_STEP_ID": "1"}
    (error,) = node_errors(2, 4, environ)
    assert "trainer.num_nodes=2 × trainer.devices=4 is 8 processes, but srun started 6" in error
    assert node_errors(2, 3, environ) == []


@pytest.mark.parametrize("step", [None, str(0xFFFFFFFB)], ids=["no_step", "batch_step"])
def test_the_sbatch_script_itself_is_refused_with_srun(step) -> None:
    """An sbatch script asking for 8 tasks that runs the command without srun: one process,
    told by SLURM_NTASKS that 7 more ranks will come, which Lightning waited for forever."""
    environ = {key: value for key, value in SRUN_2x4.items() if key != "SLURM_STEP_ID"}
    if step is not None:
        environ["SLURM_STEP_ID"] = step
    (error,) = node_errors(2, 4, environ)
    assert "SLURM_NTASKS=8, but srun did not start this process" in error
    assert "wait forever for 7 ranks" in error and "`srun python -m lightning_kd train" in error
    # One task asked for: the script's process is the run, as before.
    assert node_errors(1, 1, {"SLURM_NTASKS": "1", "SLURM_NNODES": "1"}) == []


def test_an_agreeing_launcher_passes() -> None:
    assert node_errors(2, 1, TORCHRUN_2x1) == []
    assert node_errors(2, 4, SRUN_2x4) == []


def test_a_stray_rank_without_a_launcher_is_refused() -> None:
    """A leftover LOCAL_RANK=1 made a one-process run act as rank 1: no student, no logs, and a
    summary reporting success."""
    (error,) = node_errors(1, 1, {"LOCAL_RANK": "1"})
    assert error.startswith("LOCAL_RANK=1 in the environment, but no launcher started")
    assert error.endswith("unset LOCAL_RANK")
    (error,) = node_errors(1, 1, {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "1"})
    assert "unset RANK and LOCAL_RANK" in error
    # Lightning's own launcher: each further process's LOCAL_RANK within WORLD_SIZE = devices.
    child = {"LOCAL_RANK": "1", "NODE_RANK": "0", "WORLD_SIZE": "2"}
    assert node_errors(1, 2, child) == [] and node_errors(1, "auto", child) == []
    assert node_errors(1, 1, {"LOCAL_RANK": "0"}) == []


def test_several_processes_asked_of_generate_are_named_as_not_used() -> None:
    """`generate strategy=ddp trainer.devices=2` ran one process without a word (probe 26)."""
    assert one_process_note(compose_config(["debug=smoke"])) is None
    note = one_process_note(compose_config(["debug=smoke", "strategy=ddp", "trainer.devices=2"]))
    assert note == (
        "generate: one process writes the completions (trainer.devices=2: for train and cache, "
        "not here)"
    )
    nodes = one_process_note(compose_config(["debug=smoke", "trainer.num_nodes=2"]))
    assert nodes is not None and "(trainer.num_nodes=2: for train and cache" in nodes


@pytest.mark.parametrize(
    "overrides", [["strategy=ddp"], ["trainer.devices=[0]"], ["trainer.devices='0,'"]]
)
def test_one_process_asked_for_is_not_told_as_several(overrides) -> None:
    """A strategy named on one device, or one device by index, asks for one process: the note
    said it asked for what only train and cache do (probe 30)."""
    assert one_process_note(compose_config(["debug=smoke", *overrides])) is None


@pytest.mark.parametrize(
    ("overrides", "named"),
    [([], False), (["hydra.run.dir=/shared/run"], True), (["++hydra.run.dir=/shared/run"], True)],
)
def test_a_shared_run_directory_is_found_however_it_is_named(overrides, named) -> None:
    """Only a bare ``hydra.run.dir=`` word counted as naming one: ``++hydra.run.dir=`` or a
    config's ``hydra: {run: {dir: ...}}`` was refused as Hydra's clock-made default (probe 30)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import open_dict

    from lightning_kd.launch.config import CONF_DIR, register_defaults

    register_defaults()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=overrides, return_hydra_config=True)
    with open_dict(cfg):
        cfg.hydra.mode = RunMode.RUN
    HydraConfig.instance().set_config(cfg)
    try:
        errors = node_errors(2, 1, TORCHRUN_2x1)
    finally:
        HydraConfig.instance().cfg = None
    assert (errors == []) is named, errors
    if not named:
        assert "with Hydra's default run directory" in errors[0]
