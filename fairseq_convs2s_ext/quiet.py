"""A quiet start: the warnings and log lines a user can do nothing about, left out.

Every fairseq command used to begin with about twelve lines that are not the user's to act
on: hydra's deprecation warnings about how fairseq calls it, torch's warnings about how
fairseq calls it (``pin_memory`` without an accelerator, ``torch.cuda.amp``'s deprecation),
and DEBUG lines, because one of fairseq's modules (``fairseq.models.wav2vec.
wav2vec2_classification``) calls ``logging.basicConfig(level=logging.DEBUG)`` as it is
imported, before fairseq-generate and fairseq-interactive configure logging, so their own
configuration is ignored. The hub interface logged four INFO lines about batching on each
``translate``.

What is done, and only this:

- :func:`filter_warnings`: each warning is ignored by its category and the module it is
  attributed to (and, where that module warns about other things too, its message); never a
  whole category, never a module's every warning, so a warning about the user's own code or
  data still shows. (hydra attributes one warning to ``sys`` or the command's ``__main__``:
  that one is matched by category and message.)
- :func:`repair_fairseq_logging`: in a fairseq command, the root logger that
  ``wav2vec2_classification`` set to DEBUG gets fairseq's level (``LOGLEVEL``, else INFO)
  and format.
- :func:`undo_fairseq_basic_config`: in a program of one's own that imports the plugin
  before fairseq, the root logger is left as it was before fairseq's import (a program that
  imported fairseq itself first has already been given fairseq's DEBUG root).
- :func:`at_debug`: during a call, the INFO records of the named loggers are logged at
  DEBUG (the hub's per-call batching lines).
- :func:`readable_fairseq_logs`, in a fairseq command: its configuration, which fairseq logs
  as one line of about 10,000 characters, is logged as the values that differ from their
  defaults, a line per group (:func:`non_default_values`), and fairseq-train saves the whole
  of it as ``SAVE_DIR/config.yaml``; the four lines that fairseq's ``get_batch_iterator`` logs
  each time it is called (for every buffer of fairseq-interactive, every epoch and validation
  of fairseq-train) are DEBUG records. ``CONVS2S_FULL_LOG=1`` (:data:`FULL_LOG`) keeps
  fairseq's own lines; fairseq-train saves ``config.yaml`` either way.
"""
import argparse
import contextlib
import dataclasses
import enum
import logging
import os
import sys
import warnings
from typing import Any, Dict, Optional, Tuple

# (category, module the warning is attributed to, message start): each one ignored.
UNACTIONABLE = [
    # hydra's deprecations of the API and config layout that fairseq uses.
    (UserWarning, r"hydra\.experimental\.(initialize|compose)$", ""),
    (UserWarning, r"hydra\.core\.default_element$", r"In '\w+': Usage of deprecated keyword in package header"),
    (UserWarning, r"hydra\.compose$", r"\s*The strict flag in the compose API is deprecated"),
    (UserWarning, "", r"\s*'config' is validated against ConfigStore schema with the same name"),
    # torch, about how fairseq builds its data loaders and calls autocast.
    (UserWarning, r"torch\.utils\.data\.dataloader$", r"'pin_memory' argument is set as true but no accelerator"),
    (FutureWarning, r"fairseq\.", r"`torch\.cuda\.amp\.(autocast|GradScaler)\(args\.\.\.\)` is deprecated"),
]

FAIRSEQ_FORMAT = "%(asctime)s | %(levelname)s | %(name)s | %(message)s"

FULL_LOG = "CONVS2S_FULL_LOG"  # set to 1: fairseq's own configuration line and per-batch lines
# What fairseq's FairseqTask.get_batch_iterator logs each time it is called.
PER_BATCH = ("can_reuse_epoch_itr = ", "reuse_dataloader = ", "rebuild_batches = ",
             "creating new batches for epoch ", "batches will be rebuilt for each epoch")
# The loggers of the fairseq commands that log their whole configuration (fairseq-hydra-train's
# is fairseq-train's).
CONFIGURATION_LOGGERS = ("fairseq_cli.train", "fairseq_cli.generate", "fairseq_cli.interactive",
                         "fairseq_cli.validate", "fairseq_cli.eval_lm")
# The groups of the configuration that describe how a model is trained.
TRAINING_GROUPS = ("model", "criterion", "optimizer", "lr_scheduler")
CONFIGURATION_FILE = "config.yaml"  # fairseq-train's whole configuration, in its --save-dir
_NO_DEFAULT = object()


def filter_warnings() -> None:
    for category, module, message in UNACTIONABLE:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)


def repair_fairseq_logging() -> None:
    """Give fairseq's commands the logging they configure, where a module imported before
    their ``logging.basicConfig`` took its place with DEBUG and Python's default format."""
    root = logging.getLogger()
    handlers = [h for h in root.handlers if isinstance(h, logging.StreamHandler)]
    if root.level != logging.DEBUG or len(root.handlers) != 1 or len(handlers) != 1:
        return
    if handlers[0].formatter is None or handlers[0].formatter._fmt != logging.BASIC_FORMAT:
        return
    level = os.environ.get("LOGLEVEL", "INFO").upper()
    root.setLevel(level)
    handlers[0].setFormatter(logging.Formatter(FAIRSEQ_FORMAT, datefmt="%Y-%m-%d %H:%M:%S"))


def root_logging() -> Optional[Tuple[int, list]]:
    """The root logger's level and handlers, if fairseq's models are not imported yet."""
    if "fairseq.models" in sys.modules:
        return None
    root = logging.getLogger()
    return root.level, list(root.handlers)


def undo_fairseq_basic_config(before: Optional[Tuple[int, list]]) -> None:
    """Give the root logger back the level it had ``before`` fairseq's import, if that import
    added the DEBUG handler of ``logging.basicConfig(level=logging.DEBUG)``."""
    if before is None:
        return
    level, handlers = before
    root = logging.getLogger()
    added = [h for h in root.handlers if h not in handlers]
    if root.level == logging.DEBUG != level and len(added) == 1 and added[0].formatter is not None \
            and added[0].formatter._fmt == logging.BASIC_FORMAT:
        root.removeHandler(added[0])
        root.setLevel(level)


class _AtDebug(logging.Filter):
    """INFO records (those whose message starts with one of ``prefixes``, if given) become
    DEBUG records."""

    def __init__(self, prefixes: Tuple[str, ...] = ()):
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record):
        if record.levelno == logging.INFO and (
                not self.prefixes or (isinstance(record.msg, str) and record.msg.startswith(self.prefixes))):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
        return True


@contextlib.contextmanager
def at_debug(*logger_names):
    """Within the block, INFO records of these loggers are DEBUG records."""
    loggers = [logging.getLogger(name) for name in logger_names]
    demote = _AtDebug()
    for logger in loggers:
        logger.addFilter(demote)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(demote)


def readable_fairseq_logs() -> None:
    """In a fairseq command: its configuration logged readably (and saved by fairseq-train),
    the per-batch lines of ``get_batch_iterator`` at DEBUG; fairseq's own lines with
    ``CONVS2S_FULL_LOG=1``."""
    full = os.environ.get(FULL_LOG, "") not in ("", "0")
    configuration = _ReadableConfiguration(full)
    for name in CONFIGURATION_LOGGERS:
        logging.getLogger(name).addFilter(configuration)
    if not full:
        logging.getLogger("fairseq.tasks.fairseq_task").addFilter(_AtDebug(PER_BATCH))


class _ReadableConfiguration(logging.Filter):
    """The record of a command's whole configuration (fairseq logs the DictConfig itself):
    fairseq-train's saved first; its message, unless ``full``, the non-default values."""

    def __init__(self, full: bool):
        super().__init__()
        self.full = full

    def filter(self, record):
        from omegaconf import DictConfig

        if isinstance(record.msg, DictConfig) and not record.args:
            saved = save_configuration(record.msg) if record.name == "fairseq_cli.train" else None
            if not self.full:
                record.msg = readable_configuration(record.msg, saved)
        return True


def save_configuration(cfg) -> Optional[str]:
    """fairseq-train's whole configuration ``cfg``, resolved, as ``SAVE_DIR/config.yaml``
    (plain YAML: a legacy model's argparse options as a mapping; written atomically, by rank
    0, which writes the checkpoints, unless ``--no-save``); returns its path. The folder's
    lock (:mod:`.checkpoints.save_dir_lock`, which the plugin's task takes too, re-entrant in
    one process) is taken first, so that a second training into the folder is refused before
    it replaces the first one's file."""
    from convs2s_preprocess.runtime.atomic import atomic_file
    from omegaconf import OmegaConf

    from .checkpoints import save_dir_lock

    if cfg.distributed_training.distributed_rank != 0 or cfg.checkpoint.no_save:
        return None
    save_dir_lock.hold(cfg.checkpoint.save_dir)
    path = os.path.join(cfg.checkpoint.save_dir, CONFIGURATION_FILE)
    whole = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    whole = {group: vars(node) if isinstance(node, argparse.Namespace) else node  # a legacy model's options
             for group, node in whole.items()}
    with atomic_file(path) as temp, open(temp, "w", encoding="utf-8") as f:
        f.write(OmegaConf.to_yaml(whole))
    return path


def readable_configuration(cfg, saved: Optional[str]) -> str:
    """A line for each group of ``cfg`` with a choice or a value other than its default
    (:func:`non_default_values`), under a line saying where the whole of it is."""
    where = f"all of it in {saved}" if saved else f"{FULL_LOG}=1 logs all of it"
    lines = [f"configuration, where it differs from the defaults ({where}):"]
    for group, (choice, values) in non_default_values(cfg).items():
        shown = [choice] if choice else []
        shown += [f"{key}={_shown(value)}" for key, value in values.items()]
        lines.append(f"  {group}: {' '.join(shown)}")
    return "\n".join(lines)


def _shown(value: Any) -> str:
    return repr(value) if isinstance(value, str) and (not value or any(c.isspace() for c in value)) else str(value)


def non_default_values(cfg) -> Dict[str, Tuple[Optional[str], Dict[str, Any]]]:
    """{group: (its choice, {option: value})} of fairseq's configuration ``cfg``: the choice
    (``_name``: the task, the architecture; the criterion, ... where it is not fairseq's
    default) and the options whose value is not their default. A default is that of the
    group's dataclass (for a choice, the chosen one's; for the model, its architecture's
    values over its dataclass's); an interpolated default (``II("common.seed")``) is the value
    it follows. Groups with neither are left out, and so are those of training (the model, the
    criterion, the optimizer and its schedule) in a command that reads its models from
    ``--path``, which uses the checkpoint's: fairseq fills them with values of its own there
    (fairseq-generate's model is ``wav2vec2``)."""
    from fairseq.registry import REGISTRIES
    from omegaconf import DictConfig, OmegaConf

    found = {}
    from_checkpoint = OmegaConf.select(cfg, "common_eval.path") is not None
    for group in cfg:
        node = cfg[group]
        if from_checkpoint and group in TRAINING_GROUPS:
            continue
        if isinstance(node, DictConfig):
            name = node.get("_name")
            values = OmegaConf.to_container(node, resolve=True, enum_to_str=True)
        elif isinstance(node, argparse.Namespace):  # a legacy model's: every option, the arch's among them
            name = getattr(node, "_name", None)
            values = None
        else:
            continue
        defaults = _defaults(group, name)
        if values is None:
            values = {key: getattr(node, key) for key in defaults if hasattr(node, key)}
        choice = name if name != REGISTRIES.get(group, {}).get("default") else None
        changed = {key: value for key, value in values.items()
                   if key != "_name" and not _is_default(value, defaults.get(key, _NO_DEFAULT), cfg)}
        if choice or changed:
            found[group] = (choice, changed)
    return found


def _defaults(group: str, choice: Optional[str]) -> Dict[str, Any]:
    """The defaults of a group of fairseq's configuration, for its choice."""
    from fairseq.dataclass.configs import FairseqConfig
    from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_NAME_REGISTRY, MODEL_DATACLASS_REGISTRY
    from fairseq.registry import REGISTRIES
    from fairseq.tasks import TASK_DATACLASS_REGISTRY

    if group == "model":
        dataclass = MODEL_DATACLASS_REGISTRY.get(ARCH_MODEL_NAME_REGISTRY.get(choice, choice))
    elif group == "task":
        dataclass = TASK_DATACLASS_REGISTRY.get(choice)
    elif group in REGISTRIES:  # criterion, optimizer, lr_scheduler, ...
        dataclass = REGISTRIES[group]["dataclass_registry"].get(choice)
    else:  # common, dataset, ...: FairseqConfig declares each one's dataclass as its default
        dataclass = next((f.default for f in dataclasses.fields(FairseqConfig) if f.name == group), None)
    defaults = {}
    if dataclasses.is_dataclass(dataclass):
        for f in dataclasses.fields(dataclass):
            if f.default is not dataclasses.MISSING:
                defaults[f.name] = f.default
            elif f.default_factory is not dataclasses.MISSING:
                defaults[f.name] = f.default_factory()
    if group == "model" and choice in ARCH_CONFIG_REGISTRY:
        values = argparse.Namespace()  # an architecture sets each option it has a value for
        ARCH_CONFIG_REGISTRY[choice](values)
        defaults.update(vars(values))
    return defaults


def _is_default(value: Any, default: Any, cfg) -> bool:
    from omegaconf import OmegaConf

    if isinstance(default, str) and default.startswith("${") and default.endswith("}"):
        default = OmegaConf.select(cfg, default[2:-1])
    if OmegaConf.is_config(default):
        default = OmegaConf.to_container(default, resolve=True, enum_to_str=True)
    elif dataclasses.is_dataclass(default):
        default = dataclasses.asdict(default)
    elif isinstance(default, enum.Enum):
        default = default.value
    elif isinstance(default, tuple):
        default = list(default)
    return value == default
