"""Damaged binarized data (issue 34, item 4): the task checks a split's .idx and .bin agree
before fairseq reads them, and names the file. Damage is done to real fairseq-preprocess output."""
import os
import shutil
import subprocess

import numpy as np
import pytest

from conftest import BIN, ROOT
from fairseq_convs2s_ext.data.binarized import BinarizedDataError, check_split

VOCABULARIES = {"en": 2176, "de": 2176}  # small_bin's joined dictionary


@pytest.fixture
def data(small_bin, tmp_path):
    shutil.copytree(small_bin, tmp_path / "bin")
    return tmp_path / "bin"


def truncate_bin(path):
    os.truncate(path.with_suffix(".bin"), os.path.getsize(path.with_suffix(".bin")) - 2)


def garbage_idx(path):
    path.with_suffix(".idx").write_bytes(os.urandom(300))


def truncate_idx(path):
    os.truncate(path.with_suffix(".idx"), os.path.getsize(path.with_suffix(".idx")) - 8)


def overwrite_bin(path):  # same size, ids past the dictionary
    tokens = np.memmap(path.with_suffix(".bin"), dtype=np.uint16, mode="r+")
    tokens[5] = 60000
    tokens.flush()


def swap_lengths(path):  # same sizes, the index's first two sentence lengths exchanged
    idx = path.with_suffix(".idx")
    sizes = np.memmap(idx, dtype=np.int32, mode="r+", offset=26, shape=(2,))
    if sizes[0] == sizes[1]:
        sizes[0] += 1
    sizes[:] = sizes[::-1].copy()
    sizes.flush()


@pytest.mark.parametrize("damage, why", [
    (truncate_bin, r"test.en-de.de.bin: \d+ bytes where its .idx \(10 sentences\) says \d+"),
    (garbage_idx, r"test.en-de.de.idx: not a fairseq index \(it starts .*\)"),
    (truncate_idx, r"test.en-de.de.idx: \d+ bytes where an index of the 10 sentences it declares has \d+"),
    (overwrite_bin, r"test.en-de.de.bin: token id 60000, beyond the dictionary's 2176 words"),
    (swap_lengths, r"test.en-de.de.idx: sentence 1's offset does not follow from the lengths before it"),
])
def test_damage_is_named(data, damage, why):
    check_split(data, "test", VOCABULARIES)  # the undamaged split passes
    damage(data / "test.en-de.de.idx")
    with pytest.raises(BinarizedDataError, match=why + r": the binarized data is damaged .*binarize the split again"):
        check_split(data, "test", VOCABULARIES)
    check_split(data, "train", VOCABULARIES)  # another split is not this one's business


def test_fairseq_train_stops_with_one_line_naming_the_file(data, tmp_path):
    truncate_bin(data / "valid.en-de.en.idx")
    proc = subprocess.run(
        [str(BIN / "fairseq-train"), data, "--user-dir", str(ROOT / "fairseq_convs2s_ext"), "--task",
         "convs2s_translation", "--arch", "convs2s_tiny", "--optimizer", "nag", "--lr", "0.1", "--max-tokens", "1000",
         "--num-workers", "0", "--save-dir", tmp_path / "checkpoints"], text=True, capture_output=True)
    assert proc.returncode == 1
    assert proc.stderr.splitlines()[-1].startswith(f"fairseq-train: error: {data / 'valid.en-de.en.bin'}: "), \
        proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and not (tmp_path / "checkpoints" / "checkpoint_last.pt").exists()
