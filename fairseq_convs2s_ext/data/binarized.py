"""A split's binarized files checked before fairseq reads them: ``.idx`` and ``.bin`` agree.

fairseq reads a binarized split (``SPLIT.SRC-TGT.LANG.idx``, the sentences' lengths and
offsets, and ``.bin``, their token ids) through numpy memory maps without checking them
against each other: a ``.bin`` cut short (a copy interrupted, a disk that filled up) or an
``.idx`` of garbage fails deep inside numpy, or, worse, trains on whatever bytes lie where the
index points. Before the task loads a split, :func:`check_split` checks each of its files, in
fairseq's own formats (the header constants and dtype codes are fairseq's,
``fairseq.data.indexed_dataset``): the index's header and size for the number of sentences it
declares; sentence lengths that are not negative and offsets that follow from them; a
``.bin`` exactly as long as the index says; and token ids within the dictionary. It reads the
whole index and ``.bin`` once (memory-mapped; a fraction of a second per hundred MB).
"""
import os
import re
import struct
from typing import Dict, Optional

import numpy as np
from fairseq.data.indexed_dataset import IndexedDataset, MMapIndexedDataset, _code_to_dtype


class BinarizedDataError(ValueError):
    """A binarized split whose files do not agree; the message names the file."""


REBINARIZE = "binarize the split again (convs2s-prepare or fairseq-preprocess)"


def _fail(path: str, why: str):
    raise BinarizedDataError(f"{path}: {why}: the binarized data is damaged (a copy cut short, a full disk?); "
                             f"{REBINARIZE}")


def _mmap_index(idx: str):
    """(token dtype, sentence lengths, offsets in bytes) of fairseq's mmap index (MMIDIDX)."""
    size = os.path.getsize(idx)
    header = struct.calcsize("<9sQBQ")
    if size < header:
        _fail(idx, f"{size} bytes, shorter than the index header ({header})")
    with open(idx, "rb") as f:
        _, version, code, count = struct.unpack("<9sQBQ", f.read(header))
    if version != 1 or code not in _code_to_dtype:
        _fail(idx, f"an index of version {version} with token type {code}, which fairseq does not write")
    expected = header + count * (4 + 8)
    if size != expected:
        _fail(idx, f"{size} bytes where an index of the {count} sentences it declares has {expected}")
    sizes = np.memmap(idx, dtype=np.int32, mode="r", offset=header, shape=(count,))
    pointers = np.memmap(idx, dtype=np.int64, mode="r", offset=header + 4 * count, shape=(count,))
    return np.dtype(_code_to_dtype[code]), sizes.astype(np.int64), pointers


def _check_mmap(prefix: str, vocabulary: Optional[int]) -> None:
    idx, bin_ = prefix + ".idx", prefix + ".bin"
    dtype, sizes, pointers = _mmap_index(idx)
    if (sizes < 0).any():
        _fail(idx, f"a negative sentence length (sentence {int(np.argmax(sizes < 0))})")
    ends = np.cumsum(sizes) * dtype.itemsize
    starts = ends - sizes * dtype.itemsize
    if not np.array_equal(starts, pointers):
        _fail(idx, f"sentence {int(np.argmax(starts != pointers))}'s offset does not follow from the lengths before it")
    expected = int(ends[-1]) if len(ends) else 0
    _check_tokens(bin_, dtype, expected, len(sizes), vocabulary)


def _check_legacy(prefix: str, vocabulary: Optional[int]) -> None:
    """fairseq's older format (TNTIDX: --dataset-impl lazy or cached)."""
    idx, bin_ = prefix + ".idx", prefix + ".bin"
    size, header = os.path.getsize(idx), struct.calcsize("<8sQQQQQ")
    if size < header:
        _fail(idx, f"{size} bytes, shorter than the index header ({header})")
    with open(idx, "rb") as f:
        _, version, code, element_size, count, dims = struct.unpack("<8sQQQQQ", f.read(header))
    expected = header + 8 * (2 * (count + 1) + dims)
    if version != 1 or code not in _code_to_dtype or size != expected:
        _fail(idx, f"{size} bytes where an index of the {count} sentences it declares has {expected}")
    data_offsets = np.memmap(idx, dtype=np.int64, mode="r", offset=header + 8 * (count + 1), shape=(count + 1,))
    if (np.diff(data_offsets) < 0).any():
        _fail(idx, "offsets that go backwards")
    _check_tokens(bin_, np.dtype(_code_to_dtype[code]), int(data_offsets[-1]) * element_size, count, vocabulary)


def _check_tokens(bin_: str, dtype, expected: int, count: int, vocabulary: Optional[int]) -> None:
    if not os.path.exists(bin_):
        _fail(bin_, "missing beside its .idx")
    size = os.path.getsize(bin_)
    if size != expected:
        _fail(bin_, f"{size} bytes where its .idx ({count} sentences) says {expected}")
    if vocabulary is None or size == 0:
        return
    largest = int(np.memmap(bin_, dtype=dtype, mode="r").max())
    if largest >= vocabulary:
        _fail(bin_, f"token id {largest}, beyond the dictionary's {vocabulary} words")


def check_binarized(prefix: str, vocabulary: Optional[int] = None) -> None:
    """Raise BinarizedDataError, naming the file, if ``prefix``.idx and ``prefix``.bin do not
    agree (or hold ids beyond a dictionary of ``vocabulary`` words)."""
    idx = prefix + ".idx"
    with open(idx, "rb") as f:
        magic = f.read(9)
    if magic == MMapIndexedDataset.Index._HDR_MAGIC:
        _check_mmap(prefix, vocabulary)
    elif magic[:8] == IndexedDataset._HDR_MAGIC:
        _check_legacy(prefix, vocabulary)
    else:
        _fail(idx, f"not a fairseq index (it starts {magic!r})")


def check_split(data_path: str, split: str, vocabularies: Dict[str, int]) -> None:
    """Check every binarized file of ``split`` in ``data_path`` (its shards ``split1``, ...
    too): ``SPLIT.SRC-TGT.LANG.idx`` with its ``.bin``, ids within ``vocabularies[LANG]``."""
    pattern = re.compile(rf"{re.escape(split)}\d*\.[^.]+-[^.]+\.([^.]+)\.idx")
    names = os.listdir(data_path) if os.path.isdir(data_path) else []
    for name in sorted(names):
        match = pattern.fullmatch(name)
        if match:
            check_binarized(os.path.join(data_path, name[:-len(".idx")]), vocabularies.get(match[1]))
