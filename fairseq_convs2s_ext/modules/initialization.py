"""Layers with the paper's weight normalization and initialization (section 3.5, appendix A).

Every layer except the lookup tables is weight normalized (Salimans & Kingma, 2016) over its
output dimension. Weights are drawn so that activations keep their variance:
N(0, 0.1) for embeddings, N(0, sqrt(p / n)) for a layer that is not followed by a GLU and
N(0, sqrt(4p / n)) for one that is, with n the fan-in and p the dropout retain probability
of the layer's input. Biases start at zero. Weight normalization starts with g = ||v||, so
the initial weights are exactly the drawn ones.
"""
import math

import torch.nn as nn
from torch.nn.utils import parametrizations


def Embedding(num_embeddings, embedding_dim, padding_idx):
    """A lookup table drawn from N(0, 0.1), with a zero padding row."""
    m = nn.Embedding(num_embeddings, embedding_dim, padding_idx=padding_idx)
    nn.init.normal_(m.weight, 0, 0.1)
    nn.init.zeros_(m.weight[padding_idx])
    return m


def Linear(in_features, out_features, dropout=0.0, glu=False, layer=nn.Linear):
    """A weight-normalized linear layer whose input is dropped with probability `dropout`.

    `glu=True` marks a layer whose 2d outputs feed a GLU, which halves the variance
    (hence the factor 4 in the paper's formula). `layer`: the class of linear layer.
    """
    m = layer(in_features, out_features)
    retain = 1.0 - dropout
    nn.init.normal_(m.weight, 0, math.sqrt((4 if glu else 1) * retain / in_features))
    nn.init.zeros_(m.bias)
    return parametrizations.weight_norm(m, dim=0)
