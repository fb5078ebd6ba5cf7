"""Data domains named by numbers (a year, a shard id), made the strings every check reads.

YAML and Hydra's command line read ``data.domains={2023: [a], 2024: [b]}`` with integer keys,
which no dotted path reaches: ``data.domains.2023`` missed the key ``2023`` and the config
check ended in an omegaconf traceback, exit 1 (probe 39), and a command line cannot quote such a
key. A domain's name is a name: each one, in ``data.domains`` and in each ``teachers`` entry's
``domains``, is turned into its string before any check reads the config. The values a domain
groups (files, or a column's values: ``{code: [0]}``) are left as they are.
"""

from __future__ import annotations

from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict


def string_domain_names(cfg: DictConfig) -> DictConfig:
    """``cfg``, changed in place: every domain name a string (see the module doc)."""
    data = cfg.get("data") if isinstance(cfg, DictConfig) else None
    with open_dict(cfg):
        if isinstance(data, DictConfig) and isinstance(
            domains := data._get_node("domains"), DictConfig
        ):
            named = OmegaConf.to_container(domains, resolve=False)
            if any(not isinstance(name, str) for name in named):
                data.domains = {str(name): groups for name, groups in named.items()}
        teachers = cfg._get_node("teachers") if "teachers" in cfg else None
        for entry in teachers if isinstance(teachers, ListConfig) else ():
            taught = entry._get_node("domains") if isinstance(entry, DictConfig) else None
            if isinstance(taught, ListConfig):
                names = OmegaConf.to_container(taught, resolve=False)
                entry.domains = [name if isinstance(name, str) else str(name) for name in names]
    return cfg
