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
"""
import contextlib
import logging
import os
import sys
import warnings
from typing import Optional, Tuple

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
    def filter(self, record):
        if record.levelno == logging.INFO:
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
