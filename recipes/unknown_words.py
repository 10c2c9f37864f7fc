"""What unknown-word replacement does to a word-level recipe's translations (section 4).

The paper replaces each ``<unk>`` a word-level model writes with the dictionary translation of
the source word it attends to most, or with that word itself when the dictionary has none. A
recipe with ``replace_unk`` builds that dictionary (convs2s-align-dict) from its cleaned
training text, translates the test set without and with ``--replace-unk``, and reports both
scores and what became of each ``<unk>``.
"""
import os

from convs2s_preprocess.stages.align import build_align_dict, find_aligner
from convs2s_preprocess.textio import read_lines

from .score import ScoreError

UNK = "<unk>"  # fairseq's unknown word


def align_dictionary(prepared, experiment, work):
    """``work/align.dict`` from the cleaned, tokenized training text of ``prepared`` (the text
    the model is trained on), with convs2s-align-dict's default aligner; rebuilt only when
    that text changed."""
    train = os.path.join(prepared, "tok", "train.clean")
    out = os.path.join(work, "align.dict")
    build_align_dict(f"{train}.{experiment.src}", f"{train}.{experiment.tgt}", out, find_aligner())
    return out


def count_replacements(plain, replaced, prepared, experiment, align_dict):
    """How the ``<unk>`` of the ``plain`` hypotheses became words in ``replaced``: the dictionary
    translation of a word of their source sentence (the tokenized test text of ``prepared``,
    as it was binarized), or a copied source word.

    Both are the same model's beam search, so they differ only where ``<unk>`` was replaced;
    anything else means they are not two translations of the same test set.
    """
    from fairseq.utils import load_align_dict  # here: convs2s-recipe --help stays fast

    align = load_align_dict(align_dict)
    sources = read_lines(os.path.join(prepared, "tok", f"test.{experiment.src}"))
    words = unknown = by_dictionary = 0
    for number, (before, after, source) in enumerate(zip(plain, replaced, sources), 1):
        before, after = before.split(), after.split()
        if len(before) != len(after) or any(b != a for b, a in zip(before, after) if b != UNK):
            raise ScoreError(f"translation {number} with --replace-unk differs from the one without it "
                             f"beyond its {UNK}: {' '.join(after)!r} / {' '.join(before)!r}")
        translations = {align[word] for word in source.split() if word in align}
        words += len(before)
        for b, a in zip(before, after):
            if b == UNK:
                unknown += 1
                by_dictionary += a in translations
    copied = unknown - by_dictionary
    text = (f"{unknown} of {words} words of the translations are {UNK} ({100 * unknown / max(words, 1):.1f}%); "
            f"--replace-unk put {by_dictionary} dictionary translations and {copied} copied source words there")
    return {"words": words, "unknown": unknown, "by_dictionary": by_dictionary, "copied": copied, "text": text}

