"""fconv and convs2s with identical weights: ours is always imported from fconv."""
import argparse
import copy

import torch
from fairseq import checkpoint_utils
from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY
from fairseq.tasks.translation import TranslationConfig, TranslationTask

import fairseq_convs2s_ext  # noqa: F401  (registers convs2s)
from fairseq_convs2s_ext.checkpoints.fconv_import import convert_checkpoint

from .training import SETTINGS


def translation_task(data_bin, src="en", tgt="de"):
    cfg = TranslationConfig(data=str(data_bin), source_lang=src, target_lang=tgt, left_pad_source=True,
                            dataset_impl=None, train_subset="train", required_seq_len_multiple=1)
    return TranslationTask.setup_task(cfg)


def convs2s_task(data_bin, src="en", tgt="de", vocab_selection=None, **selection):
    """The plugin's convs2s_translation: its generator has the beam step measured faster on
    the device (the lean one on a CPU, ``beam_step`` to choose); with
    ``vocab_selection`` (a candidates file) each batch scores only its candidate words, and
    ``selection`` sets the task's other selection options where not None (``vocab_most_common``,
    ``vocab_rest_clusters``, ...)."""
    from fairseq import tasks
    from omegaconf import OmegaConf

    options = {"_name": "convs2s_translation", "data": str(data_bin), "source_lang": src, "target_lang": tgt,
               "vocab_selection": vocab_selection and str(vocab_selection)}
    options.update((name, value) for name, value in selection.items() if value is not None)
    return tasks.setup_task(OmegaConf.create(options))


def new_fconv(task, arch, dropout, seed=1):
    """A freshly initialized fconv of `arch` (fairseq's registry), as fairseq-train builds it."""
    torch.manual_seed(seed)
    args = argparse.Namespace(arch=arch, _name=arch, dropout=dropout, max_source_positions=1024,
                              max_target_positions=1024)
    ARCH_CONFIG_REGISTRY[arch](args)
    return ARCH_MODEL_REGISTRY[arch].build_model(args, task), args


def fconv_copy(fconv, args, task):
    """A copy of an fconv model (its weight-norm hooks cannot be deep-copied)."""
    model = ARCH_MODEL_REGISTRY[args.arch].build_model(copy.copy(args), task)
    model.load_state_dict(fconv.state_dict())
    return model


def load_fconv(checkpoint, task):
    (model,), _, _ = checkpoint_utils.load_model_ensemble_and_task([str(checkpoint)], task=task)
    state = checkpoint_utils.load_checkpoint_to_cpu(str(checkpoint))
    args = state["args"] if state.get("args") is not None else state["cfg"]["model"]
    return model, args


def convs2s_criterion(task):
    """Our criterion: the same label-smoothed loss as fconv's label_smoothed_cross_entropy."""
    from fairseq_convs2s_ext.criterions import ConvS2SCrossEntropyCriterion

    return ConvS2SCrossEntropyCriterion(task, SETTINGS.criterion.label_smoothing)


def convs2s_like(fconv, args, task):
    """convs2s with fconv's weights, through convs2s-import-fconv's conversion."""
    state = convert_checkpoint({"args": args, "model": fconv.state_dict()}, task.source_dictionary,
                               task.target_dictionary, "in-memory fconv")
    options = state["args"]
    model = ARCH_MODEL_REGISTRY["convs2s"].build_model(argparse.Namespace(**vars(options)), task)
    model.load_state_dict(state["model"])
    return model
