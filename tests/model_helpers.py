"""Build small ConvS2S models through fairseq's real registries and translation task."""
import argparse

import torch
from fairseq.data import Dictionary
from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY
from fairseq.tasks.translation import TranslationConfig, TranslationTask

import fairseq_convs2s_ext  # noqa: F401  (registers the model)


def dictionary(size=40):
    d = Dictionary()
    for i in range(size):
        d.add_symbol(f"w{i}")
    return d


def build(arch="convs2s_tiny", vocab=40, max_positions=64, **overrides):
    """A model of `arch`, with command-line style overrides such as encoder_layers="[(16, 1)]"."""
    d = dictionary(vocab)
    task = TranslationTask(TranslationConfig(), d, d)
    args = argparse.Namespace(
        arch=arch, max_source_positions=max_positions, max_target_positions=max_positions, **overrides
    )
    ARCH_CONFIG_REGISTRY[arch](args)
    return ARCH_MODEL_REGISTRY[arch].build_model(args, task), d


def random_tokens(d, batch, length):
    return torch.randint(d.nspecial, len(d), (batch, length))


def with_random_biases(model):
    """Biases start at zero; a trained model's do not, and a rewrite of the model's
    arithmetic (generation's folds) must carry them."""
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("bias"):
                parameter.normal_(0, 0.5)
    return model
