"""The Hydra configs, shipped inside the package (so a wheel or ``pip install .`` runs as a clone does).

    from spectr_repro.conf import conf_dir
    conf_dir() / "model_pair" / "tiny_random.yaml"

``SPECTR_REPRO_CONF`` points at another folder laid out the same way (config.yaml plus one folder
per config group); every part of the package (runner, model registry, bench) reads configs through
``conf_dir()``.
"""

from __future__ import annotations

import os
from pathlib import Path

from spectr_repro.errors import ConfigFolderError

CONF_ENV_VAR = "SPECTR_REPRO_CONF"
PACKAGED_CONF = Path(__file__).resolve().parent



def conf_dir() -> Path:
    """The config folder: ``$SPECTR_REPRO_CONF`` when set, else the one shipped in the package."""
    explicit = os.environ.get(CONF_ENV_VAR)
    path = Path(explicit).expanduser() if explicit else PACKAGED_CONF
    if not (path / "config.yaml").is_file():
        raise ConfigFolderError(f"cannot find the Hydra configs: {path}/config.yaml does not exist"
                                + (f" ({CONF_ENV_VAR}={explicit})" if explicit else ""))
    return path


def group_options(group: str) -> list[str]:
    """The options of a config group: the yaml files in ``conf_dir()/<group>/``."""
    folder = conf_dir() / group
    return sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []


__all__ = ["CONF_ENV_VAR", "ConfigFolderError", "conf_dir", "group_options"]
