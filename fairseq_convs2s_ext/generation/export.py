"""A trained model exported for serving without fairseq: two ``torch.export`` programs that
``convs2s_serving`` (torch alone) beam-searches.

``convs2s-export`` writes a folder (:func:`export`):

- ``encoder.pt2``: :class:`SourceEncoding`, source ids (sentences x S, left-padded, each
  ending with eos) to what every decoder step reads of them;
- ``step.pt2``: :class:`IncrementalStep`, one decoder step of M hypotheses for each of B
  sentences, from the last word of each hypothesis and the windows of the last k inputs
  of each convolution, to the features W_o multiplies and the new windows;
- ``output.pt``: W_o's weights and bias (:func:`output_layer`), which the runtime multiplies
  the features by into a logits tensor of its own, reused at every step of a batch. Inside
  the program W_o's product was a new hypotheses x V tensor at each call, fresh memory whose
  first touch took its int8 product from 3.6 to 6.5 ms a step (the benchmark's 640 x 256 ->
  9792, 2 threads, Intel Xeon with VNNI), as it had the plugin's (``reuse_logits``);
- ``model.json``: both vocabularies, the special symbols' ids, the windows' shapes, the
  width of the step's features, the longest input and output the positions allow, and the
  languages;
- ``bpe.codes``: the BPE codes the model's data was segmented with, where there are some;
- ``selection.pt``, exported with vocabulary selection (``--vocab-selection``,
  :func:`selection_tables`): each source word's aligned target words and the words every
  sentence has, from which the runtime takes each sentence's candidates as the plugin's
  generation does (:mod:`convs2s_serving.candidates`), and the clusters of W_o's rows that
  stand for the words a sentence's candidates leave out (``--vocab-rest-clusters``).

The programs are the plugin's own modules traced by ``torch.export`` after
``make_generation_fast_`` (weight normalization folded into the weights, fc2 into W_o where
generation folds it): the same operations as the plugin's beam search over fairseq's
SequenceGenerator, in float32, with two of its shortcuts left out. The first convolution is
computed as the others are (the plugin looks its products up per word seen), and the first
step reads the sources through each attention's projections, as every later step does
(the plugin's first step, made for one hypothesis a sentence, reads them unprojected). Both
are the same numbers up to rounding; the hypotheses are the plugin's (tests/test_export.py
compares them and their scores). Each convolution is a linear map of a window of its last k
inputs, and GradMultiply, which changes only gradients, leaves an alias.

A model quantized to int8 (:mod:`.quantization`, ``convs2s-export --quantize int8``) is
exported with its int8 weights, each linear layer, and each attention's projections of the
source, one call of ``torch.ops.convs2s.int8_linear`` (:mod:`convs2s_serving.int8_linear`,
the kernel the plugin runs). The first step reads the projected sources, where the plugin's
reads them unprojected, through the attention's int8 layers: the hypotheses are mostly, not
all, the plugin's int8 ones.

Exported: the whole vocabulary, and with ``--vocab-selection`` the candidate tables, which the
runtime uses unless told not to (``convs2s-serve --no-vocab-selection``). Not exported:
ensembles, unknown-word replacement (the runtime returns ``<unk>`` as the plugin does without
``--replace-unk``).
"""
import contextlib
import json
import os
import shutil
from typing import List

import torch
import torch.nn as nn
import torch.nn.functional as F
from convs2s_preprocess.runtime.atomic import atomic_outputs
from convs2s_serving.safe_loading import check_archive
from convs2s_serving.translator import FORMAT, OUTPUT_LAYER, SELECTION

from ..modules.multistep_attention import ProjectedSource
from ..modules.scaling import scaled_sum
from .quantization import Int8Buffers, Int8Weights, quantize_weight


class SourceEncoding(nn.Module):
    """The encoder's output z (sentences x S x embedding) and, for each decoder layer with an
    attention, its projections of the source (``MultiStepAttention.project_source``: keys,
    key bias with -inf at padding, values), in the decoder's order."""

    def __init__(self, model):
        super().__init__()
        self.encoder = model.encoder
        self.attention = nn.ModuleList(a for a in model.decoder.attention if a is not None)

    def forward(self, src_tokens: torch.Tensor):
        encoder_out = self.encoder(src_tokens)
        sources: List[torch.Tensor] = []
        for attention in self.attention:
            sources.extend(attention.project_source(encoder_out))
        return encoder_out["encoder_out"][0], sources


class IncrementalStep(nn.Module):
    """One step of the decoder for ``tokens`` (sentences x hypotheses, the last word of
    each hypothesis) at position ``step`` (from 0, a 0-d tensor). ``windows``: for each
    convolution wider than 1, the last k inputs of each hypothesis (sentences x hypotheses
    x k x channels, zeros before the first word); ``z`` and ``sources``: what
    :class:`SourceEncoding` returned for the sentences. Returns the features W_o multiplies
    into the logits of the next word (sentences x hypotheses x embedding: the runtime
    multiplies them by :func:`output_layer`) and the windows moved on by one input."""

    def __init__(self, model):
        super().__init__()
        self.decoder = model.decoder
        self.padding_idx = model.decoder.dictionary.pad()

    def forward(self, tokens: torch.Tensor, step: torch.Tensor, windows: List[torch.Tensor],
                z: torch.Tensor, sources: List[torch.Tensor]):
        # Every tensor is sentences x hypotheses x features: the hypotheses of a sentence are
        # the attention's "steps" reading its source, and nothing is reshaped by a size that
        # may be 1 (torch.export would specialize the program to it).
        decoder = self.decoder
        # e_j = w_j + p_j at position j = step (fairseq's positions count from padding_idx + 1)
        position = decoder.embed.positions.weight.index_select(0, (step + self.padding_idx + 1).view(1))
        g = decoder.embed.tokens(tokens) + position
        x = decoder.fc1(g)
        encoder_out = {"encoder_out": (z, z), "encoder_padding_mask": None}  # the key bias masks padding
        moved, attending, fields = [], 0, len(ProjectedSource._fields)
        for residual_projection, convolution, attention in zip(
            decoder.residual_projections, decoder.convolutions, decoder.attention
        ):
            residual = residual_projection(x)
            if convolution.kernel_width > 1:  # the window of the last k inputs, as GLUConvolution's step
                window = torch.cat([windows[len(moved)][:, :, 1:], x.unsqueeze(2)], dim=2)
                moved.append(window)
                x = window.flatten(2)
            x = F.glu(convolution.linear(x), dim=-1)
            if attention is not None:
                source = ProjectedSource(*sources[fields * attending: fields * (attending + 1)])
                x, _ = attention(x, g, encoder_out, source)
                attending += 1
            x = scaled_sum(x, residual)
        return decoder.fc2(x), moved


# where the source positions are in each of a layer's projected sources
SOURCE_POSITIONS = ProjectedSource(embedding_keys=2, keys=2, key_bias=2, values=1)


def output_layer(model):
    """W_o's tensors, as ``output.pt`` holds them: ``weight`` (V x embedding) and ``bias``
    (V) in float32; for a model quantized to int8, ``weight_int8`` and ``weight_scale`` (per
    word) instead of ``weight`` (fc2 folded in where generation folds it)."""
    projection = model.decoder.output_projection
    tensors = {"bias": projection.bias.detach()}
    if isinstance(projection, Int8Weights):
        tensors.update(weight_int8=projection.weight_int8, weight_scale=projection.weight_scale)
    else:
        tensors["weight"] = projection.weight.detach()
    return tensors


def selection_tables(model, selection):
    """``selection.pt``'s tensors for ``selection`` (the task's ``VocabularySelection``):
    ``aligned`` (int32, a row of target ids per source id) and ``always`` (the ids every
    sentence has); where W_o estimates the words left out (``OutputProjection.estimate_rest``),
    ``rest_labels`` (a cluster id per word, -1 for those of ``always``), each cluster's mean
    row of W_o and b_o, ``rest_weight`` and ``rest_bias``, the rows quantized per row as the
    plugin quantizes them for an int8 model (``rest_weight_int8``, ``rest_weight_scale``)."""
    tables = {"aligned": selection.aligned.to(torch.int32).cpu(), "always": selection.always.long().cpu()}
    projection = model.decoder.output_projection
    if projection.rest_clusters is not None:
        with torch.no_grad():
            weight, bias = projection.rest_mean_rows()
        tables.update(rest_labels=projection.rest_clusters.labels.cpu(), rest_bias=bias)
        if isinstance(projection, Int8Weights):
            tables["rest_weight_int8"], tables["rest_weight_scale"] = quantize_weight(weight)
        else:
            tables["rest_weight"] = weight
    return tables


def window_shapes(model):
    """(k, channels) of each window that :class:`IncrementalStep` keeps."""
    return [(c.kernel_width, c.in_channels) for c in model.decoder.convolutions if c.kernel_width > 1]


@contextlib.contextmanager
def int8_weights_stored(model):
    """The int8 layers' weights as persistent buffers while the model is exported (torch.export
    stores the others as constants, which the archive check refuses), non-persistent again
    after, as quantization made them."""
    int8 = [module for module in model.modules() if isinstance(module, Int8Buffers)]

    def registered(persistent):
        for module in int8:
            for name in module.int8_buffers:
                module.register_buffer(name, getattr(module, name), persistent=persistent)

    registered(True)
    try:
        yield
    finally:
        registered(False)


def export(model, directory, languages=(None, None), bpe_codes=None, romanian=False, selection=None):
    """Write ``model`` (a ConvS2S model prepared for generation, in float32 or quantized to
    int8) into ``directory`` as the module's docstring says, for the CPU; the folder appears whole or not at all.
    ``languages`` (source, target), ``bpe_codes`` (a file) and ``romanian`` (the source was
    prepared with the Romanian steps) are what the runtime needs to translate raw text;
    ``selection`` (the task's ``VocabularySelection``, W_o's ``estimate_rest`` done) the
    candidates of vocabulary selection."""
    model = model.float().cpu()  # fairseq has put it in eval mode (a prepared model has no train())
    src_dict, tgt_dict = model.encoder.dictionary, model.decoder.dictionary
    sentences, hypotheses = torch.export.Dim("sentences", min=1), torch.export.Dim("hypotheses", min=1)
    # a source of one token is eos alone, an empty sentence: the runtime translates it as empty
    length = torch.export.Dim("length", min=2, max=model.encoder.max_positions())
    src_tokens = torch.full((2, 3), src_dict.eos())
    with torch.no_grad(), int8_weights_stored(model):
        encoder = torch.export.export(SourceEncoding(model), (src_tokens,),
                                      dynamic_shapes=({0: sentences, 1: length},))
        z, sources = SourceEncoding(model)(src_tokens)
        shapes, attending = window_shapes(model), model.decoder.attending_layers
        tokens = torch.full((2, 3), tgt_dict.eos())
        windows = [torch.zeros(2, 3, k, c) for k, c in shapes]
        step = torch.export.export(
            IncrementalStep(model), (tokens, torch.tensor(0), windows, z, sources),
            dynamic_shapes=({0: sentences, 1: hypotheses}, None, [{0: sentences, 1: hypotheses}] * len(windows),
                            {0: sentences, 1: length},
                            [{0: sentences, dim: length} for dim in SOURCE_POSITIONS] * len(attending)),
        )
    int8 = [m.weight_int8 for m in model.modules() if isinstance(m, Int8Weights)]
    config = {
        "format": FORMAT,
        "bos": tgt_dict.bos(), "pad": tgt_dict.pad(), "eos": tgt_dict.eos(), "unk": tgt_dict.unk(),
        "nspecial": tgt_dict.nspecial, "source_eos": src_dict.eos(), "source_pad": src_dict.pad(),
        "source_unk": src_dict.unk(), "windows": shapes, "max_target_positions": model.decoder.max_positions(),
        "max_source_positions": model.encoder.max_positions(),
        "source_lang": languages[0], "target_lang": languages[1], "romanian": romanian,
        "source_symbols": list(src_dict.symbols), "target_symbols": list(tgt_dict.symbols),
        "output_features": model.decoder.output_projection.in_features,  # the step's features, W_o's input
        "quantize": "int8" if int8 else "none",
    }
    if int8:  # 127, or 63 if quantized on a CPU without VNNI: a CPU serving it must sum these exactly
        config["int8_weight_levels"] = max(int(q.abs().max()) for q in int8)
    tables = None if selection is None else selection_tables(model, selection)
    if tables is not None:
        config["vocabulary_selection"] = {"most_common": len(tables["always"]) - tgt_dict.nspecial,
                                          "top_aligned": tables["aligned"].size(1),
                                          "rest_clusters": len(tables.get("rest_bias", ()))}
    with atomic_outputs([os.fspath(directory)]) as (temp,):
        os.makedirs(temp)
        for name, program in (("encoder.pt2", encoder), ("step.pt2", step)):
            torch.export.save(program, os.path.join(temp, name))
            check_archive(os.path.join(temp, name))  # what convs2s-serve will accept, or no folder
        torch.save(output_layer(model), os.path.join(temp, OUTPUT_LAYER))
        if tables is not None:
            torch.save(tables, os.path.join(temp, SELECTION))
        if bpe_codes:
            shutil.copyfile(bpe_codes, os.path.join(temp, "bpe.codes"))
        with open(os.path.join(temp, "model.json"), "w", encoding="utf-8") as f:
            json.dump(config, f)
