"""Unknown-word replacement for word-level models.

Gehring et al. (2017), results of the word-based models, after Jean et al. (2015) and Luong
et al. (2015): each ``<unk>`` of a hypothesis is replaced by the dictionary translation of the
source word with the highest attention averaged over the decoder layers (the attention the
ConvS2S decoder returns); a source word without an entry in the dictionary is copied. The
dictionary is fairseq's ``--replace-unk`` file, one ``source target`` pair a line (built from
word alignments of the training data by ``convs2s-align-dict``); a bare ``--replace-unk``
only copies.

Which source word:
- Only the source text's words compete. The end-of-sentence marker, padding and positions
  past the source text never win: when the highest attention falls on one of them, the word
  with the highest attention among the source words is taken instead.
- Ties go to the earlier source word.

What cannot be replaced, and what comes out instead:
- An ``<unk>`` of an empty source (nothing to copy), or whose replacement would itself be the
  literal ``<unk>`` (a source text containing ``<unk>``), is written ``<<unk>>``, fairseq's
  escaped unknown word. A bare ``<unk>`` must not remain: fairseq-generate and
  fairseq-interactive run fairseq's own ``utils.replace_unk`` on the output after us, and it
  crashes on every ``<unk>`` it finds (it indexes an alignment that is empty, or made of
  (source, target) pairs with ``--print-alignment``).

With BPE (subword-nmt's ``@@`` continuation marker, the BPE of our recipes), only whole-word
unknowns are replaced:
- Source pieces are joined into words (``Zu@@ g`` -> ``Zug``); the attended piece stands for
  its word, which is looked up in the dictionary (built on words) or copied whole.
- A target ``<unk>`` that continues a word (the token before it ends with ``@@``) is not
  replaced and comes out as ``<<unk>>``. An unknown piece that begins a word cannot be told
  from a whole word (``<unk>`` lost its ``@@``), so it is replaced like one, and the word's
  remaining pieces follow the replacement as a word of their own.
Other segmentations (sentencepiece) are taken as words, piece by piece.

The generator wrapper adds the replacement words to the target dictionary when they are not
in it, because fairseq prints hypotheses through it (``tgt_dict.string``); fairseq-generate
adds them itself when it scores. (The hub interface decodes them directly instead, see
:mod:`..models.hub_interface`.) The model's output layer is unaffected, but a generator built later on the
same dictionary would take its grown length for the model's vocabulary: build generators
before translating, as fairseq's commands do.
"""
import os
from typing import Dict, List, Sequence, Tuple

import torch
from fairseq.tokenizer import tokenize_line

BPE_CONTINUATION = "@@"


class AlignDictError(ValueError):
    """A --replace-unk dictionary that cannot be read; the message names the file and line."""


def read_align_dict(path: str) -> Dict[str, str]:
    """fairseq's --replace-unk file: ``source target`` a line, as ``utils.load_align_dict``
    reads it (which fails on a line of one word with a bare IndexError); "" copies only."""
    if not path:
        return {}
    if not os.path.isfile(path):
        raise AlignDictError(f"{path}: no such --replace-unk dictionary; build it with "
                             f"convs2s-align-dict, or give --replace-unk alone to copy source words")
    align_dict = {}
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            try:
                columns = raw.decode("utf-8").split()
            except UnicodeDecodeError:
                raise AlignDictError(f"{path} line {number}: not UTF-8 text") from None
            if len(columns) != 2:
                raise AlignDictError(
                    f"{path} line {number}: {raw.decode('utf-8', 'replace').strip()!r} has "
                    f"{len(columns)} words, not 'source target': the file is not an alignment "
                    f"dictionary (convs2s-align-dict writes one)")
            align_dict[columns[0]] = columns[1]
    return align_dict


def source_words(tokens: Sequence[str]) -> Tuple[List[str], List[int]]:
    """Join BPE pieces into words: the words, and for each token the index of its word."""
    words, word_of_token, prefix = [], [], ""
    for token in tokens:
        word_of_token.append(len(words))
        if token.endswith(BPE_CONTINUATION):
            prefix += token[: -len(BPE_CONTINUATION)]
        else:
            words.append(prefix + token)
            prefix = ""
    if prefix:  # text ending inside a word
        words.append(prefix)
    return words, word_of_token


def replace_unknowns(hypothesis: Sequence[str], attention: torch.Tensor, source: Sequence[str],
                     align_dict: Dict[str, str], unk: str) -> List[str]:
    """Replace each whole-word ``unk`` of ``hypothesis``; the others stay ``unk``.

    ``attention`` is len(hypothesis) x n: row i is hypothesis token i's attention over the
    source positions, of which the first len(source) are the tokens of the source text
    (``source``); further columns (end of sentence, past the source) are never chosen.
    """
    words, word_of_token = source_words(source)
    candidates = min(len(source), attention.size(1))
    output = list(hypothesis)
    for i, token in enumerate(hypothesis):
        continues_word = i > 0 and hypothesis[i - 1].endswith(BPE_CONTINUATION)
        if token != unk or continues_word or candidates == 0:
            continue
        word = words[word_of_token[int(attention[i, :candidates].argmax())]]
        output[i] = align_dict.get(word, word)
    return output


def hypothesis_words(hypo, word_positions: torch.Tensor, source: Sequence[str], tgt_dict,
                     align_dict: Dict[str, str]) -> List[str]:
    """The tokens of a generated hypothesis as words, each whole-word ``<unk>`` replaced.

    ``hypo["attention"]`` is S x T over a batch's source positions, of which
    ``word_positions`` hold this sentence's source tokens ``source`` (the end of sentence and
    padding excluded).
    """
    attention = hypo.get("attention")
    if attention is None or attention.numel() == 0:
        raise RuntimeError(
            "unknown-word replacement needs the decoder's attention, and the model returned "
            "none; models that compute it only on request get it with --print-alignment"
        )
    # S x T over the padded batch -> T x W over this sentence's words.
    word_attention = attention.index_select(0, word_positions.to(attention.device)).t().float()
    hypothesis = [tgt_dict[t] for t in hypo["tokens"].tolist()]
    return replace_unknowns(hypothesis, word_attention, source, align_dict, tgt_dict.unk_word)


class UnknownWordReplacer:
    """A fairseq generator whose hypotheses come out with their unknown words replaced.

    It wraps the generator that fairseq's task builds (beam search, sampling, with or without
    ``--print-alignment``) and reads everything else from it. Each sample must carry
    ``src_text``, the source lines of its sentences as they were binarized (tokenized, and
    BPE-segmented if any); ``convs2s_translation`` provides it.
    """

    def __init__(self, generator, src_dict, tgt_dict, align_dict: Dict[str, str]):
        self.generator = generator
        self.src_dict = src_dict
        self.tgt_dict = tgt_dict
        self.align_dict = align_dict

    def __getattr__(self, name):  # eos, symbols_to_strip_from_output, ... of the wrapped one
        if name == "generator":
            raise AttributeError(name)
        return getattr(self.generator, name)

    @torch.no_grad()
    def generate(self, models, sample, **kwargs):
        if "src_text" not in sample:
            raise ValueError("unknown-word replacement needs the source text of each sentence "
                             "(sample['src_text']); use --task convs2s_translation")
        hypos = self.generator.generate(models, sample, **kwargs)
        for src_tokens, text, nbest in zip(sample["net_input"]["src_tokens"], sample["src_text"], hypos):
            is_word = src_tokens.ne(self.src_dict.pad()) & src_tokens.ne(self.src_dict.eos())
            word_positions = is_word.nonzero().squeeze(1)
            source = tokenize_line(text)
            for hypo in nbest:
                hypo["tokens"] = self._replace(hypo, word_positions, source)
        return hypos

    def _replace(self, hypo, word_positions, source):
        tokens = hypo["tokens"]
        unknowns = tokens.eq(self.tgt_dict.unk()).nonzero().squeeze(1).tolist()
        if not unknowns:
            return tokens
        replaced = hypothesis_words(hypo, word_positions, source, self.tgt_dict, self.align_dict)
        tokens = tokens.clone()
        for i in unknowns:
            tokens[i] = self._index(replaced[i])
        return tokens

    def _index(self, word):
        if word == self.tgt_dict.unk_word:
            word = self.tgt_dict.unk_string(escape=True)
        if word in self.tgt_dict:
            return self.tgt_dict.index(word)
        return self.tgt_dict.add_symbol(word)
