"""hydra/launcher=submitit_slurm|submitit_local: the plugin's launchers, shaped by the run's
trainer, and refused before anything is submitted when a job could not run."""

from __future__ import annotations

import os

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import DictConfig

from lightning_kd.cli.hydra_command import LaunchCheck, run_hydra
from lightning_kd.launch.cluster import PLUGIN, launcher_errors, launcher_override_errors
from lightning_kd.launch.config import CONF_DIR, register_defaults

pytestmark = pytest.mark.usefixtures("slurm_client")  # judged as on a login node


def composed(*overrides: str) -> DictConfig:
    """The config ``lightning-kd train -m <overrides>`` launches with, Hydra's node included."""
    register_defaults()
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=list(overrides), return_hydra_config=True)


def qualified(launcher: object) -> str:
    # By name: Hydra's plugin discovery imports the plugin afresh (a class of its own).
    return f"{type(launcher).__module__}.{type(launcher).__qualname__}"


def test_the_launchers_are_the_plugins_shaped_by_the_trainer(tmp_path) -> None:
    sweep = f"hydra.sweep.dir={tmp_path}"
    shape = ["trainer.num_nodes=2", "trainer.devices=4"]
    slurm = composed("hydra/launcher=submitit_slurm", *shape, sweep)
    launcher = instantiate(slurm.hydra.launcher)
    assert qualified(launcher) == f"{PLUGIN}.submitit_launcher.SlurmLauncher"  # from our YAML
    params = launcher.params
    assert (params["nodes"], params["tasks_per_node"], params["gpus_per_node"]) == (2, 4, 4)
    assert params["submitit_folder"] == f"{tmp_path}/.submitit/%j"
    assert params["additional_parameters"] == {"signal": "TERM@120"}  # our stop, not USR2's
    assert params["partition"] is None and params["max_num_timeout"] == 0  # the plugin's fields
    assert launcher_errors(slurm) == []

    local = composed("hydra/launcher=submitit_local", "debug=smoke", sweep)
    assert (
        qualified(instantiate(local.hydra.launcher)) == f"{PLUGIN}.submitit_launcher.LocalLauncher"
    )
    assert launcher_errors(local) == []
    assert launcher_errors(composed("debug=smoke", "trainer.devices=auto")) == []  # basic


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["hydra/launcher=submitit_slurm", "trainer.devices=auto"],
            "trainer.devices='auto' with hydra/launcher=submitit_slurm: SLURM starts one task "
            "per device (hydra.launcher.tasks_per_node, trainer.devices unless set), and "
            "Lightning checks the two agree, so it must be a number; give the GPUs per node, "
            "e.g. trainer.devices=4",
        ),
        (
            [
                "hydra/launcher=submitit_slurm",
                "trainer.devices=4",
                "hydra.launcher.tasks_per_node=2",
            ],
            "hydra.launcher.tasks_per_node=2 with trainer.devices=4: Lightning under SLURM runs",
        ),
        (
            ["hydra/launcher=submitit_slurm", "hydra.launcher.nodes=2"],
            "hydra.launcher.nodes=2 with trainer.num_nodes=1: Lightning stops a job whose node "
            "count differs",
        ),
        (
            ["hydra/launcher=submitit_slurm", "trainer.devices=1", "hydra.launcher.mem_gb=-1"],
            "hydra.launcher.mem_gb=-1: give a number >= 1 (or null: the cluster's default)",
        ),
        (
            ["hydra/launcher=submitit_slurm", "trainer.devices=1", "trainer.accelerator=cpu"],
            "hydra.launcher.gpus_per_node=1 with trainer.accelerator=cpu: the job would hold GPUs",
        ),
        (
            ["hydra/launcher=submitit_local", "trainer.devices=2"],
            "trainer.devices=2 with hydra/launcher=submitit_local: a job of the local launcher "
            "runs on one device; give trainer.devices=1",
        ),
    ],
)
def test_a_job_that_could_not_run_is_refused_with_the_fix(overrides, message) -> None:
    (error,) = launcher_errors(composed(*overrides))
    assert error.startswith(message)


def test_a_slurm_launch_from_a_machine_without_the_slurm_client_is_refused(
    slurm_client, monkeypatch, capsys
) -> None:
    """submitit's own answer was a ``RuntimeError`` traceback, after the sweep directory was
    written."""
    (slurm_client / "srun").unlink()
    slurm = composed("hydra/launcher=submitit_slurm", "trainer.devices=1", "hydra.sweep.dir=/s")
    (error,) = launcher_errors(slurm)
    assert error.startswith(
        "hydra/launcher=submitit_slurm submits with sbatch and starts tasks with srun, and this "
        "machine has no srun on its PATH: launch from a login node"
    )
    assert error.endswith("or run the jobs on this machine with hydra/launcher=submitit_local")
    monkeypatch.setenv("PATH", os.defpath)
    assert "has no sbatch or srun on its PATH" in launcher_errors(slurm)[0]
    sweep = slurm_client.parent / "sweep"
    argv = ["-m", "hydra/launcher=submitit_slurm", "trainer.devices=1", f"hydra.sweep.dir={sweep}"]
    assert "has no sbatch or srun on its PATH" in refused_lines(argv, capsys)[1]
    assert not sweep.exists()  # refused before Hydra writes multirun.yaml


def test_the_launch_check_exits_2_before_anything_is_submitted(capsys) -> None:
    """What Hydra's callback does with the composed config, before its launcher submits."""
    cfg = composed(
        "hydra/launcher=submitit_slurm", "trainer.devices=auto", "seed=-1", "hydra.sweep.dir=/s"
    )
    assert cfg.hydra.callbacks.launch_check._target_.endswith("hydra_command.LaunchCheck")
    with pytest.raises(SystemExit) as exit_:
        LaunchCheck().on_multirun_start(config=cfg)
    assert exit_.value.code == 2
    stderr = capsys.readouterr().err
    # The launcher's problem and the config's, at once: each job would find the second only
    # once it left the queue.
    assert stderr.startswith("lightning-kd: 2 values are refused:\n  trainer.devices='auto'")
    assert "seed=-1" in stderr


def refused_lines(argv: list[str], capsys) -> list[str]:
    """The lines ``argv``'s launch printed, refused (exit 2) before any task ran."""
    with pytest.raises(SystemExit) as exit_:
        run_hydra(lambda cfg: pytest.fail("the task ran"), argv)
    assert exit_.value.code == 2
    return capsys.readouterr().err.split("\n")


def test_a_wrong_typed_launcher_field_is_refused_before_hydra_composes(capsys) -> None:
    argv = [
        "-m",
        "hydra/launcher=submitit_slurm",
        "hydra.launcher.nodes=two",
        "hydra.launcher.timeout_min=abc",
        "hydra.launcher.partition=gpu",
    ]
    assert refused_lines(argv, capsys)[:3] == [
        "lightning-kd: 2 values are refused:",
        "  hydra.launcher.nodes=two: Value 'two' of type 'str' could not be converted to "
        "Integer; e.g. hydra.launcher.nodes=2",
        "  hydra.launcher.timeout_min=abc: Value 'abc' of type 'str' could not be converted to "
        "Integer; e.g. hydra.launcher.timeout_min=240",
    ]
    setup = ["-m", "hydra/launcher=submitit_slurm", "hydra.launcher.setup=module load cuda"]
    (line,) = [line for line in refused_lines(setup, capsys) if "setup" in line]
    assert line.endswith(
        "e.g. hydra.launcher.setup='[module load cuda, source /shared/venv/bin/activate]'"
    )
    # Without a submitit launcher selected, hydra.launcher.* is Hydra's to judge.
    assert launcher_override_errors(["-m", "hydra.launcher.n_jobs=x"]) == []


def test_a_submitit_launcher_without_its_plugin_names_the_install(monkeypatch) -> None:
    """Without the cluster extra, Hydra's own error was "Could not load
    'hydra/launcher/submitit_slurm_base'", naming no fix."""
    from hydra.core.config_store import ConfigStore
    from hydra.plugins.config_source import ConfigLoadError

    def missing(self, config_path: str):
        raise ConfigLoadError(f"Could not load '{config_path}'")

    monkeypatch.setattr(ConfigStore, "load", missing)
    (error,) = launcher_override_errors(["-m", "hydra/launcher=submitit_slurm", "seed=0,1"])
    assert "needs Hydra's submitit launcher plugin" in error
    assert "pip install hydra-submitit-launcher" in error
