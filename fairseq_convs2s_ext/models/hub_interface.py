"""``ConvS2SModel.from_pretrained``: translate raw sentences from Python.

    from fairseq_convs2s_ext import ConvS2SModel
    hub = ConvS2SModel.from_pretrained("checkpoints", data_name_or_path="data")
    hub.translate("A dog runs through the snow.", beam=5)
    hub.translate(["A dog runs.", "Two men talk."], beam=5, nbest=3)   # 3 hypotheses each
    hub.translate("A dog runs.", replace_unk="align.dict")               # word-level models

fairseq's hub machinery (``hub_utils.from_pretrained``, ``GeneratorHubInterface``) loads the
checkpoint; this module finds what a ``convs2s-prepare`` folder holds and fairseq's hub
expects beside the checkpoint:

- the dictionaries: ``data_name_or_path`` is the prepared folder (its ``bin/``) or the
  binarized folder itself; as in fairseq, a path starting with ``.`` is taken from the
  checkpoint's folder;
- the BPE codes: ``bpe/codes`` of the prepared folder (or ``code``/``bpecodes`` beside the
  dictionaries, or beside the checkpoint, where fairseq's hub looks), applied with
  subword-nmt; none with a word-level (``--no-bpe``) folder;
- the tokenizer: Moses for the checkpoint's languages, without escaping (``&`` stays
  ``&``) and with aggressive hyphen splitting, as ``convs2s-prepare`` tokenizes (it also
  normalizes punctuation first, which fairseq's Moses tokenizer does not).

Any of these can be given instead, with fairseq's names (``tokenizer="space"``,
``bpe="subword_nmt"``, ``bpe_codes=...``), as can generation options (``lenpen=...``).

What the interface adds to fairseq's:

- ``nbest``: ``translate``/``sample`` return the n best hypotheses of each sentence (a list
  of strings per sentence) instead of the best one;
- ``replace_unk``: the paper's unknown-word replacement (see :mod:`..generation.unknown_words`), with a
  dictionary file, or ``""`` to copy the attended source word, given to ``from_pretrained``
  or to one call. fairseq's hub interface ignores ``--replace-unk``; here the source text of
  each sentence reaches the replacement, whatever task the checkpoint was trained with. The
  replaced words are decoded directly and never added to the target dictionary, whose size
  must stay the model's for the next call's beam search;
- whatever task the checkpoint was trained with, an empty sentence translates as empty (not
  an invented sentence) and one longer than the model takes raises a ValueError saying so
  (fairseq's exception names a command-line option);
- ``translate``/``sample`` take a str or a list of str and raise a TypeError for anything
  else, where fairseq's would translate each byte of a ``bytes`` and ``None`` as a word;
- ``layer_attention``: each decoder layer's attention for a sentence pair, and their
  average (drawn by ``convs2s-plot-attention``, :mod:`..cli.plot_attention`);
- ``quantize="int8"`` (given to ``from_pretrained``): the decoders' linear layers multiply in
  int8 on a CPU (:mod:`..generation.quantization`), whatever task the checkpoint was trained
  with (fairseq would pass an unknown option on to a task that may not have it);
- ``segment``, ``batches`` and ``sample_segmented``: ``translate``'s steps one by one (a raw
  sentence's BPE pieces, fairseq's batches, the translation of segmented sentences), with
  which :mod:`.hub_workers` shares the batches out among processes.
"""
import contextlib
import os
from dataclasses import dataclass
from typing import Dict, List, Optional, Union

import torch
from fairseq import hub_utils
from fairseq.data import encoders
from fairseq.data.encoders.moses_tokenizer import MosesTokenizerConfig
from fairseq.data.encoders.subword_nmt_bpe import SubwordNMTBPEConfig
from fairseq.tokenizer import tokenize_line
from omegaconf import OmegaConf, open_dict

from ..generation.quantization import check_mode, quantize_
from ..generation.unknown_words import hypothesis_words, read_align_dict
from ..quiet import at_debug

# Where BPE codes may lie, relative to the binarized folder: fairseq's hub names, then the
# layout of a convs2s-prepare folder.
BPE_CODES = ("code", "bpecodes", os.path.join("..", "bpe", "codes"))


def binarized_folder(data_path: str) -> str:
    """The folder of the dictionaries: ``data_path`` itself, or its ``bin/`` (a prepared folder)."""
    for folder in (os.path.join(data_path, "bin"), data_path):
        if any(name.startswith("dict.") for name in _listdir(folder)):
            return folder
    raise FileNotFoundError(
        f"{data_path}: no fairseq dictionaries (dict.LANG.txt) here or in {os.path.join(data_path, 'bin')}; "
        "pass data_name_or_path=the folder convs2s-prepare wrote, or its bin/"
    )


def bpe_codes(bin_dir: str) -> Optional[str]:
    return next((os.path.abspath(os.path.join(bin_dir, name)) for name in BPE_CODES
                 if os.path.isfile(os.path.join(bin_dir, name))), None)


def _listdir(folder):
    return os.listdir(folder) if os.path.isdir(folder) else []


def from_pretrained(model_name_or_path, checkpoint_file="checkpoint_best.pt", data_name_or_path=".", **kwargs):
    quantize = check_mode(kwargs.pop("quantize", "none"))
    model_path, data_path = os.path.abspath(model_name_or_path), os.fspath(data_name_or_path)
    if data_path.startswith("."):  # as in fairseq: from the checkpoint's folder
        data_path = os.path.join(model_path, data_path)
    bin_dir = binarized_folder(data_path)
    loaded = hub_utils.from_pretrained(model_path, checkpoint_file, os.path.abspath(bin_dir), **kwargs)
    cfg, task = loaded["args"], loaded["task"]
    with open_dict(cfg):
        if "tokenizer" not in kwargs:
            cfg.tokenizer = OmegaConf.structured(MosesTokenizerConfig(
                source_lang=task.cfg.source_lang, target_lang=task.cfg.target_lang, moses_no_escape=True))
            cfg.tokenizer._name = "moses"
        codes = bpe_codes(bin_dir)
        if "bpe" not in kwargs and cfg.bpe is None and codes is not None:
            cfg.bpe = OmegaConf.structured(SubwordNMTBPEConfig(bpe_codes=codes))
            cfg.bpe._name = "subword_nmt"
    hub = ConvS2SHubInterface(cfg, task, loaded["models"])  # prepares the models for generation
    quantize_(hub.models, quantize)
    return hub


def check_sentences(sentences) -> None:
    """A TypeError unless ``sentences`` is a list (or tuple) of str: fairseq's interface would
    translate each byte of a ``bytes`` as a sentence, and a ``None`` in a list as a sentence."""
    if not isinstance(sentences, (list, tuple)):
        decode = isinstance(sentences, (bytes, bytearray))
        hint = ": decode it first, e.g. sentences.decode('utf-8')" if decode else ""
        raise TypeError(f"translate/sample take a str or a list of str, not {type(sentences).__name__}{hint}")
    for i, sentence in enumerate(sentences):
        if not isinstance(sentence, str):
            raise TypeError(f"translate/sample take a str or a list of str: sentences[{i}] is "
                            f"{type(sentence).__name__}, not str")


class SentenceTooLong(ValueError):
    """A sentence longer than the model takes: the ``index``-th of those given, ``length``
    tokens, more than ``limit``."""

    def __init__(self, index: int, length: int, limit: int):
        self.index, self.length, self.limit = index, length, limit
        super().__init__(self.named(f"sentence {index}"))

    def named(self, name: str) -> str:
        """The message, the sentence called ``name``."""
        return (f"{name} is {self.length} tokens long (its words or BPE pieces after tokenization, and </s>), "
                f"more than the {self.limit} the model takes: split it")


@dataclass
class LayerAttention:
    """The attention of a sentence pair: row i is target token i's attention over the source
    tokens (columns), both as the model sees them (BPE pieces, ending with ``</s>``)."""

    source_tokens: List[str]
    target_tokens: List[str]
    layers: Dict[int, torch.Tensor]  # decoder layer number (from 1) -> T x S, the layers that attend
    average: torch.Tensor  # T x S, their average: what the decoder returns for alignment and <unk>


class ConvS2SHubInterface(hub_utils.GeneratorHubInterface):
    """fairseq's hub interface with n-best output, unknown-word replacement and the attention
    of every decoder layer."""

    def __init__(self, cfg, task, models):
        super().__init__(cfg, task, models)  # reads the align dict of cfg.generation.replace_unk
        with open_dict(cfg):
            cfg.generation.replace_unk = None  # replaced here, not by the task's generator
        self.target_tokenizer = self.tokenizer  # for target sentences given as text
        if cfg.tokenizer is not None and cfg.tokenizer.get("_name") == "moses":
            self.target_tokenizer = encoders.build_tokenizer(
                OmegaConf.merge(cfg.tokenizer, {"source_lang": cfg.tokenizer.target_lang}))

    @torch.no_grad()
    def layer_attention(self, source: str, target: Optional[str] = None, beam: int = 5) -> LayerAttention:
        """Each decoder layer's attention for a raw ``source`` sentence and either a raw
        ``target`` (forced decoding) or, without one, the model's own best translation (beam
        search). With an ensemble, the first model's."""
        source_text = self.apply_bpe(self.tokenize(source))
        src_tokens = self.binarize(source_text)
        if target is None:
            tgt_tokens = self.generate([src_tokens], beam=beam)[0][0]["tokens"].cpu()
            target_words = [self.tgt_dict[t] for t in tgt_tokens.tolist()]
        else:
            target_text = self.apply_bpe(self.target_tokenizer.encode(target) if self.target_tokenizer else target)
            tgt_tokens = self.tgt_dict.encode_line(target_text, add_if_not_exist=False).long()
            target_words = target_text.split() + [self.tgt_dict.eos_word]  # its words, also the unknown ones
        prev_output_tokens = torch.cat([tgt_tokens.new_tensor([self.tgt_dict.eos()]), tgt_tokens[:-1]])
        model = self.models[0]
        encoder_out = model.encoder(src_tokens[None].to(self.device),
                                    src_lengths=torch.tensor([src_tokens.numel()], device=self.device))
        _, extra = model.decoder(prev_output_tokens[None].to(self.device), encoder_out, return_all_attention=True)
        return LayerAttention(
            source_tokens=source_text.split() + [self.src_dict.eos_word],
            target_tokens=target_words,
            layers={number: a[0].float().cpu() for number, a in zip(model.decoder.attending_layers, extra["layer_attn"])},
            average=extra["attn"][0][0].float().cpu(),
        )

    def sample(self, sentences: Union[str, List[str]], beam: int = 1, verbose: bool = False, nbest: int = 1,
               replace_unk: Optional[str] = None, **kwargs):
        """Translate raw sentences: for each, its best hypothesis (``nbest=1``) or a list of its
        ``nbest`` best. ``replace_unk``: an alignment dictionary file, or ``""`` to copy."""
        if isinstance(sentences, str):
            return self.sample([sentences], beam, verbose, nbest, replace_unk, **kwargs)[0]
        check_sentences(sentences)
        return self.sample_segmented([self.segment(sentence) for sentence in sentences], beam, verbose, nbest,
                                     replace_unk, **kwargs)

    def segment(self, sentence: str) -> str:
        """A raw sentence as the model reads it: tokenized, and split into BPE pieces."""
        return self.apply_bpe(self.tokenize(sentence))

    def sample_segmented(self, texts: List[str], beam: int = 1, verbose: bool = False, nbest: int = 1,
                         replace_unk: Optional[str] = None, **kwargs):
        """:meth:`sample` of sentences already segmented by :meth:`segment`."""
        if nbest > beam:
            raise ValueError(f"nbest={nbest} needs a beam of at least {nbest} (beam={beam})")
        align_dict = self.align_dict if replace_unk is None else read_align_dict(replace_unk)
        tokens = [self.binarize(text) for text in texts]
        self._check_lengths(tokens)
        words = [i for i, t in enumerate(tokens) if t.numel() > 1]  # an empty sentence is </s> alone
        with self._attention(align_dict is not None):
            generated = self.generate([tokens[i] for i in words], beam, verbose, **kwargs) if words else []
        hypotheses = dict(zip(words, generated))
        outputs = []
        for i, (src_tokens, text) in enumerate(zip(tokens, texts)):
            # an empty sentence translates as empty, as in fairseq-interactive with the plugin's task
            best = [self._decode(hypo, src_tokens, text, align_dict) for hypo in hypotheses[i][:nbest]] \
                if i in hypotheses else [""] * nbest
            outputs.append(best[0] if nbest == 1 else best)
        return outputs

    def batches(self, tokenized_sentences) -> List[List[int]]:
        """The batches that :meth:`generate` translates these sentences in, each a list of their
        positions in ``tokenized_sentences``, in fairseq's order (by length). The sentences of
        one batch, translated alone in that order, make that one batch again: that is how
        ``convs2s-translate --workers`` shares them out (:mod:`..cli.translate`)."""
        iterator = self._batch_iterator(tokenized_sentences, skip_invalid_size_inputs=False)
        return [[int(i) for i in batch] for batch in iterator.frozen_batches]

    def _build_batches(self, tokens, skip_invalid_size_inputs):
        return self._batch_iterator(tokens, skip_invalid_size_inputs).next_epoch_itr(shuffle=False)

    def _batch_iterator(self, tokens, skip_invalid_size_inputs):
        """fairseq's batching for the hub (``GeneratorHubInterface._build_batches``)."""
        lengths = torch.LongTensor([t.numel() for t in tokens])
        return self.task.get_batch_iterator(
            dataset=self.task.build_dataset_for_inference(tokens, lengths), max_tokens=self.cfg.dataset.max_tokens,
            max_sentences=self.cfg.dataset.batch_size, max_positions=self.max_positions,
            ignore_invalid_inputs=skip_invalid_size_inputs, disable_iterator_cache=True)

    def _check_lengths(self, tokenized_sentences) -> None:
        """:class:`SentenceTooLong` for a sentence longer than the model takes (fairseq's exception
        names a command-line option, --skip-invalid-size-inputs-valid-test, that a program has not)."""
        limit = self.max_positions[0] if isinstance(self.max_positions, (tuple, list)) else self.max_positions
        for i, tokens in enumerate(tokenized_sentences):
            if limit is not None and tokens.numel() > limit:
                raise SentenceTooLong(i, tokens.numel(), limit)

    def generate(self, tokenized_sentences, *args, **kwargs):
        if kwargs.get("replace_unk") is not None:
            raise ValueError("replace_unk needs the source text, which token ids do not keep: "
                             "use translate() or sample(), which take the sentences")
        self._check_lengths(tokenized_sentences)
        with at_debug("fairseq.tasks.fairseq_task"):  # its batching lines, at INFO on every call
            return super().generate(tokenized_sentences, *args, **kwargs)

    def _decode(self, hypo, src_tokens, text, align_dict) -> str:
        tokens = hypo["tokens"]
        if align_dict is None or not tokens.eq(self.tgt_dict.unk()).any():
            return self.decode(tokens)
        # Sources are left-padded in a batch (fairseq's build_dataset_for_inference), and
        # end with the end-of-sentence marker.
        padding = hypo["attention"].size(0) - src_tokens.numel()
        word_positions = torch.arange(padding, padding + src_tokens.numel() - 1)
        words = hypothesis_words(hypo, word_positions, tokenize_line(text), self.tgt_dict, align_dict)
        eos = self.tgt_dict.eos()
        sentence = " ".join(word for word, token in zip(words, tokens.tolist()) if token != eos)
        return self.detokenize(self.remove_bpe(sentence))

    @contextlib.contextmanager
    def _attention(self, needed: bool):
        """Let the decoders return their attention for this call (not in generation otherwise)."""
        decoders = [model.decoder for model in self.models] if needed else []
        saved = [decoder.need_attn for decoder in decoders]
        for decoder in decoders:
            decoder.need_attn = True
        try:
            yield
        finally:
            for decoder, need_attn in zip(decoders, saved):
                decoder.need_attn = need_attn
