"""What ``train`` refuses before anything loads, all at once: every config value, the nodes
against the launcher that started the process, the data (its files, a dataset's splits and
columns), the model settings, the tokenizer pair, each given cache's being whole, its records
and dtype, lengths against the teacher's positions, a GGUF export and ``lm_eval.tasks``.

The same list checks each job of a ``-m`` sweep before the first runs (``sweeps.py``): a
divergence misspelt, or a data file missing, in the last job was found once the jobs before
it had trained (probe 37).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from omegaconf.errors import OmegaConfBaseException

from lightning_kd.launch.cache_dtype_checks import cache_dtype_errors
from lightning_kd.launch.cache_k_checks import cache_k_errors
from lightning_kd.launch.checks import config_errors
from lightning_kd.launch.data_checks import data_file_errors, dataset_errors
from lightning_kd.launch.entry import entry_errors, student_length, teacher_length
from lightning_kd.launch.gguf_export import gguf_errors
from lightning_kd.launch.harness_run import harness_errors
from lightning_kd.launch.model_checks import model_setting_errors
from lightning_kd.launch.model_paths import model_path_errors
from lightning_kd.launch.named_cache_checks import named_cache_errors
from lightning_kd.launch.nodes import node_errors
from lightning_kd.launch.paths import foreign_directory_errors
from lightning_kd.launch.rules import ABSENT, lookup
from lightning_kd.launch.tokenizer_checks import tokenizer_pair_errors


def train_errors(cfg: Mapping) -> list[str]:
    """One message per thing ``train`` would refuse in ``cfg``, before any model loads."""
    num_nodes = lookup(cfg, "trainer.num_nodes")
    nodes = node_errors(1 if num_nodes is ABSENT else num_nodes, lookup(cfg, "trainer.devices"))
    # Models the path checks refuse are not read (a hub id out of reach: a minute of retries
    # for each check that read it, probe 41); entry_errors says why.
    paths = model_path_errors(cfg)  # each may ask the hub: asked once, given to entry_errors
    readable = not paths
    extra = model_setting_errors(cfg, readable) + nodes + data_file_errors(cfg)
    extra += dataset_errors(cfg) + directory_errors(cfg)
    if readable:
        extra += tokenizer_pair_errors(cfg)  # tokenizers load only where it asks the cross path
        extra += named_cache_errors(cfg) + cache_k_errors(cfg, "train") + cache_dtype_errors(cfg)
        extra += gguf_errors(cfg)
    # Before a cache is written, as `cache`; a key the config lacks (no samples) is not compared.
    lengths = [teacher_length(cfg, "data.block_size"), student_length(cfg, "data.block_size")]
    lengths.append(teacher_length(cfg, "callbacks.samples.max_new_tokens"))  # prompts add later
    extra += harness_errors(cfg)
    return entry_errors(cfg, lengths=lengths, extra=extra, paths=paths)


def directory_errors(cfg: Mapping) -> list[str]:
    """The run directory, where it is another run's or command's (``paths.py``)."""
    try:
        directory = lookup(cfg, "output_dir")
    except OmegaConfBaseException:  # ${hydra:...} outside a launch: no directory to judge yet
        return []
    return foreign_directory_errors(Path(directory)) if isinstance(directory, str) else []


def train_job_errors(cfg: Mapping, here: bool) -> list[str]:
    """A sweep's job of ``train``, checked before the first runs: all of :func:`train_errors`
    where it runs ``here`` (Hydra's basic launcher); where a cluster launcher submits it, what
    the config says alone (its values, the model settings), as the nodes, files and models are
    the cluster's to find, and the job checks them all again once it starts."""
    if here:
        return train_errors(cfg)
    return config_errors(cfg) + model_setting_errors(cfg)
