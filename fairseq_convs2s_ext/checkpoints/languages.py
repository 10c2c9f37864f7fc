"""The language pair a checkpoint was trained on, checked against the one it is used for.

A model trained en->de and run with ``-s de -t en`` translates German input as if it were
English and writes German; with a joined dictionary (one ``dict`` for both sides) the
dictionary fingerprints (:mod:`.dictionaries`) match, so nothing else would stop it.

Where the pair is known: fairseq saves a task's ``state`` in every checkpoint (``task_state``)
and merges it back into the task of the run that loads the checkpoint, before the model is
built, whatever the task. The model's ``build_model`` (which sees the task) records its
task's pair there as it is built for training, and compares it when built from a
checkpoint. A checkpoint written before the pair was recorded falls back on its
configuration's ``task.source_lang``/``target_lang``, set when it was trained with -s/-t
(fairseq does not save the pair it infers from the data folder's file names).
"""
from typing import Optional, Tuple

from omegaconf import DictConfig

from .errors import CheckpointError

STATE_KEY = "convs2s_language_pair"


class LanguagePairMismatch(CheckpointError):
    """A checkpoint used to translate another pair of languages than it was trained on."""


def _pair(source, target) -> Optional[Tuple[str, str]]:
    return (str(source), str(target)) if source and target else None


def trained_pair(model_cfg, task) -> Optional[Tuple[str, str]]:
    """The pair the model of ``model_cfg`` (its checkpoint's configuration, when loaded) was
    trained on, if known."""
    recorded = task.state.state_dict.get(STATE_KEY) if getattr(task, "state", None) is not None else None
    if recorded:
        return _pair(*recorded)
    root = model_cfg._get_parent() if isinstance(model_cfg, DictConfig) else None
    task_cfg = root.get("task") if root is not None else None
    return _pair(task_cfg.get("source_lang"), task_cfg.get("target_lang")) if task_cfg is not None else None


def check_language_pair(model_cfg, task) -> None:
    """Refuse a model trained on another pair than ``task``'s; record ``task``'s pair in its
    state, which fairseq saves in the checkpoints."""
    cfg = getattr(task, "cfg", None)
    current = _pair(getattr(cfg, "source_lang", None), getattr(cfg, "target_lang", None))
    if current is None or getattr(task, "state", None) is None:
        return
    trained = trained_pair(model_cfg, task)
    if trained is not None and trained != current:
        (src, tgt), (run_src, run_tgt) = trained, current
        raise LanguagePairMismatch(
            f"the checkpoint was trained to translate {src}->{tgt}, and this run asks for {run_src}->{run_tgt} "
            f"(-s {run_src} -t {run_tgt}): pass -s {src} -t {tgt}, or a checkpoint trained {run_src}->{run_tgt}")
    task.state.merge_state_dict({STATE_KEY: list(current)})
