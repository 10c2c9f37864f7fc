"""A split that fairseq cannot use, named in one line before fairseq reads it.

- A missing file. fairseq's translation task finds a split by its source side alone
  (``SPLIT.SRC-TGT.SRC.idx`` and ``.bin``, or the pair named the other way round) and loads
  the target side only where both of its files are there (``load_langpair_dataset``). So
  with a target file missing, fairseq-train trains on sources alone until the model, given
  no previous target tokens, stops with a TypeError; with a source file missing, fairseq
  raises ``Dataset not found: SPLIT``, naming neither the file nor the fix.
  :func:`missing_files` says which file is missing and what to do.
- A sentence longer than the model takes, in a split that fairseq-generate translates or
  fairseq-train validates: fairseq stops with "Size of sample #N is invalid" and a
  traceback. :func:`too_long` names the file, the sentence and the two ways out. It is
  refused rather than skipped (fairseq-interactive skips such a line and goes on): a score
  over a test set with sentences left out is not the test set's score, and convs2s-score
  refuses one; fairseq's --skip-invalid-size-inputs-valid-test skips them knowingly.

The plugin's task refuses such a split with these messages before training or generation
starts, and the excepthook words fairseq's errors with them under fairseq's own task.
"""
import os
import re
from typing import List, Optional

import numpy as np

from .binarized import REBINARIZE


class SplitError(ValueError):
    """A split that fairseq cannot use; the message names the file and the fix."""


def side_files(prefix: str, lang: str, dataset_impl: Optional[str]) -> List[str]:
    """The files of one side of a split whose names start with ``prefix`` (``DIR/SPLIT.SRC-TGT.``)
    as fairseq looks for them (``indexed_dataset.dataset_exists``): the text file with
    ``--dataset-impl raw``, else the ``.idx`` and the ``.bin``."""
    return [prefix + lang] if dataset_impl == "raw" else [prefix + lang + ".idx", prefix + lang + ".bin"]


def splits_in(data_path: str) -> List[str]:
    """The names of the binarized splits in ``data_path`` (``SPLIT.SRC-TGT.LANG.idx``)."""
    names = os.listdir(data_path) if os.path.isdir(data_path) else []
    return sorted({m[1] for m in map(re.compile(r"([^.]+)\.[^.]+-[^.]+\.[^.]+\.idx").fullmatch, names) if m})


def split_prefix(data_path: str, split: str, src: str, tgt: str, dataset_impl: Optional[str]) -> Optional[str]:
    """``DIR/SPLIT.SRC-TGT.`` or ``DIR/SPLIT.TGT-SRC.``, whichever has a file of either side
    (fairseq tries them in that order), else None."""
    for a, b in ((src, tgt), (tgt, src)):
        prefix = os.path.join(data_path, f"{split}.{a}-{b}.")
        if any(os.path.exists(f) for lang in (src, tgt) for f in side_files(prefix, lang, dataset_impl)):
            return prefix
    return None


def missing_files(data_path: str, split: str, src: str, tgt: str, dataset_impl: Optional[str] = None,
                  target: bool = True) -> Optional[str]:
    """``PATH: what is missing; what to do`` for ``split`` of the pair ``src``-``tgt`` in
    ``data_path``, or None where its files are there: the source side's, and, if ``target``,
    the target side's (fairseq-generate translates a split without one, as fairseq does)."""
    prefix = split_prefix(data_path, split, src, tgt, dataset_impl)
    if prefix is None:
        held, first = splits_in(data_path), side_files(f"{split}.{src}-{tgt}.", src, dataset_impl)[0]
        return (f"{data_path}: no split {split!r} for {src}-{tgt} (no {first}); the folder holds "
                f"{'the splits ' + ', '.join(held) if held else 'no binarized split'}: "
                f"check the split's name (--train-subset, --valid-subset, --gen-subset) and -s/-t, or {REBINARIZE}")
    sides = (src, tgt) if target else (src,)
    missing = [f for lang in sides for f in side_files(prefix, lang, dataset_impl) if not os.path.exists(f)]
    if not missing:
        return None
    also = f" (and {', '.join(os.path.basename(f) for f in missing[1:])})" if missing[1:] else ""
    return (f"{missing[0]}: missing{also}: split {split!r} needs the files of both sides, {src} and {tgt}; "
            f"{REBINARIZE}")


def too_long(dataset, max_positions, data_path: str, split: str, src: str, tgt: str,
             dataset_impl: Optional[str]) -> Optional[str]:
    """``PATH: which sentence is too long; what to do`` for the first sentence of ``dataset``
    (``split`` of ``data_path``) that fairseq would refuse for ``max_positions`` (source,
    target), else None."""
    _, refused = dataset.filter_indices_by_size(np.arange(len(dataset)), max_positions)
    if len(refused) == 0:
        return None
    index = int(refused[0])
    limits = max_positions if isinstance(max_positions, (tuple, list)) else (max_positions, max_positions)
    sizes = dataset.size(index)  # tokens of (source, target), </s> included
    side = 0 if limits[0] is not None and sizes[0] > limits[0] else 1
    prefix = split_prefix(data_path, split, src, tgt, dataset_impl) or os.path.join(data_path, f"{split}.{src}-{tgt}.")
    others = f" (and {len(refused) - 1} more)" if len(refused) > 1 else ""
    return (f"{side_files(prefix, (src, tgt)[side], dataset_impl)[-1]}: sentence {index + 1}{others} is "
            f"{sizes[side]} tokens long, more than the model takes ({limits[side]}): remove line {index + 1} "
            f"from both sides of the split's text and binarize it again, or pass "
            f"--skip-invalid-size-inputs-valid-test to leave such sentences out (a score over the others is not "
            f"the split's)")
