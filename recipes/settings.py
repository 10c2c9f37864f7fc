"""The paper's training settings (section 4.2) for code that does not compose a hydra config.

Their one home is ``paper.yaml`` in the recipes' config folder (:data:`CONFIG_DIR`, installed
with the package as its data, printed by ``convs2s-recipe --config-dir``), with a recipe's
``recipe/NAME.yaml`` over it: the recipes and ``fairseq-hydra-train --config-dir
"$(convs2s-recipe --config-dir)"`` compose those files with hydra. The benchmark (its
reference fconv is trained by stock ``fairseq-train``, its timing loop builds fairseq's
optimizer itself) and the tests that run ``fairseq-train`` read the same files here, with
omegaconf alone, so that a setting changed in the YAML changes for them too.
"""
import argparse
import os
from typing import List, Optional

from omegaconf import DictConfig, OmegaConf

# Package data (setup.py's package_data): found beside this module in a checkout, an editable
# install and a wheel alike.
CONFIG_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")


class PrintConfigDir(argparse.Action):
    """``--config-dir``: print :data:`CONFIG_DIR` and exit, whatever else the command line says
    (as ``--help`` does), for ``fairseq-hydra-train --config-dir "$(convs2s-recipe --config-dir)"``."""

    def __init__(self, option_strings, dest, help=None):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(CONFIG_DIR)
        parser.exit()

# The optimization settings, as (config group, key): NAG and its momentum, the learning rate
# and its reduce-on-plateau schedule, gradient clipping, label smoothing and dropout. The
# criterion's name is the caller's: convs2s_cross_entropy with the plugin, fairseq's
# label_smoothed_cross_entropy without it; both take --label-smoothing.
OPTIMIZATION = (
    ("optimizer", "_name"), ("optimizer", "momentum"), ("optimizer", "weight_decay"),
    ("optimization", "lr"), ("optimization", "clip_norm"), ("optimization", "stop_min_lr"),
    ("lr_scheduler", "_name"), ("lr_scheduler", "lr_shrink"),
    ("criterion", "label_smoothing"), ("model", "dropout"),
)


def training_config(recipe: Optional[str] = None) -> DictConfig:
    """``paper.yaml``, or ``recipe/RECIPE.yaml`` over it (``recipe="multi30k_demo"``).

    A config's ``defaults`` that name another file of ``recipes/configs`` (``/paper``,
    ``/recipe/NAME``) are read first and the file's own keys over them, as hydra composes
    them (each of our configs lists ``_self_`` last). A group choice (``/model: ARCH``) adds
    the architecture's dataclass defaults, which are not settings written in these files,
    and is left out.
    """
    return _load(f"recipe/{recipe}" if recipe else "paper")


def _load(name: str) -> DictConfig:
    config = OmegaConf.load(os.path.join(CONFIG_DIR, f"{name}.yaml"))
    parents = [entry[1:] for entry in config.pop("defaults", [])
               if isinstance(entry, str) and entry.startswith("/")]
    config.pop("hydra", None)
    return OmegaConf.merge(*[_load(parent) for parent in parents], config)


def fairseq_options(config: DictConfig) -> List[str]:
    """The :data:`OPTIMIZATION` settings of ``config`` as fairseq-train's command-line options
    (``--optimizer nag --momentum 0.99 ... --lr 0.25 --clip-norm 0.1 ...``); unset ones are left out."""
    options = []
    for group, key in OPTIMIZATION:
        value = OmegaConf.select(config, f"{group}.{key}")
        if value is None:
            continue
        flag = group if key == "_name" else key
        if OmegaConf.is_list(value):
            value = ",".join(str(v) for v in value)
        options += ["--" + flag.replace("_", "-"), str(value)]
    return options
