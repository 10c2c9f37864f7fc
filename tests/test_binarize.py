"""binarize's own reading and encoding against fairseq's, on the lines where they could part:
whitespace that is not a space, empty lines, CRLF, words spelled like special symbols. Its
resumption from shards: tests/test_shards.py."""
import os
from pathlib import Path

import numpy as np
import pytest

from fairseq.binarizer import FileBinarizer, VocabularyDatasetBinarizer
from fairseq.data.indexed_dataset import MMapIndexedDataset
from fairseq.tasks.translation import TranslationTask

from convs2s_preprocess.runtime.atomic import run_step, shard_folder
from convs2s_preprocess.stages.binarize import LOG_FILE, binarize, write_index
from convs2s_preprocess.errors import PreprocessError
from convs2s_preprocess.runtime.shards import SHARD_VARIABLE

# Every kind of whitespace str.split and fairseq's tokenize_line know, and none that ends a line
# for fairseq's reader but \n (\x0b, \x0c, \x1c-\x1e, \x85, \u2028 and \u2029 end one for
# str.splitlines).
SPACES = "\t\x0b\x0c\x1c\x1d\x1e\x1f\x85\xa0\u1680\u2000\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
TRAIN = ["a man rides a horse", "", "   ", f"a{SPACES}dog runs{SPACES}", "ein Mann\r",
         "</s> <unk> <pad> <s>", "ein\u3000Hund läuft\tschnell"]
VALID = ["a cat rides a unicorn", "<unk> zebra zebra", "", "ein\x85Pferd\u2028läuft",
         "a\r\nhorse"]  # no \n after the last line


def test_binarize_unusual_lines_as_fairseq(tmp_path: Path, monkeypatch):
    """On 1 and 3 workers, and in a step's shards of 2 lines (the last one ragged)."""
    monkeypatch.setenv(SHARD_VARIABLE, "2")
    for split, lines in (("train", TRAIN), ("valid", VALID)):
        for lang, side in (("en", lines), ("de", lines[::-1])):
            text = "\n".join(side) + ("\n" if split == "train" else "")
            (tmp_path / f"{split}.{lang}").write_bytes(text.encode("utf-8"))
    ref = tmp_path / "ref"
    ref.mkdir()
    vocab = TranslationTask.build_dictionary([str(tmp_path / "train.en"), str(tmp_path / "train.de")],
                                             threshold=0, padding_factor=8)
    vocab.save(str(ref / "dict.txt"))
    summaries = []
    for lang in ("en", "de"):
        for split in ("train", "valid"):
            in_path = str(tmp_path / f"{split}.{lang}")
            summary = FileBinarizer.multiprocess_dataset(
                in_path, "mmap", VocabularyDatasetBinarizer(vocab, append_eos=True),
                str(ref / f"{split}.en-de.{lang}"), vocab_size=len(vocab))
            summaries.append(f"[{lang}] {in_path}: {summary} (by <unk>)")
    assert "0.0% replaced" not in summaries[1]  # zebra, cat and unicorn, not <unk>

    inputs = [str(tmp_path / f"{split}.{lang}")
              for split in ("train", "valid") for lang in ("en", "de")]
    for workers, in_step in ((1, False), (3, False), (3, True)):
        out = tmp_path / f"workers{workers}{'-step' * in_step}"

        def write(destdir: str) -> None:
            binarize(destdir, "en", "de", trainpref=str(tmp_path / "train"),
                     validpref=str(tmp_path / "valid"), workers=workers)
        if in_step:
            assert run_step("binarize", inputs, [str(out)], write)
            assert not os.path.exists(shard_folder(str(out)))
        else:
            write(str(out))
        assert (out / LOG_FILE).read_text().splitlines() == summaries
        for lang in ("en", "de"):
            assert (out / f"dict.{lang}.txt").read_bytes() == (ref / "dict.txt").read_bytes()
            for split in ("train", "valid"):
                for ext in ("bin", "idx"):
                    name = f"{split}.en-de.{lang}.{ext}"
                    assert (out / name).read_bytes() == (ref / name).read_bytes(), (workers, name)


def test_text_that_is_not_utf8_names_the_file_and_line(tmp_path: Path):
    (tmp_path / "train.en").write_bytes(b"a man\nrides a horse\n")
    (tmp_path / "train.de").write_bytes(b"ein Mann\nreitet ein Pferd \xe4\n")
    with pytest.raises(PreprocessError, match=r"train\.de, line 2: not valid UTF-8"):
        binarize(str(tmp_path / "out"), "en", "de", trainpref=str(tmp_path / "train"), workers=2)


@pytest.mark.parametrize("content", [b"word\n", b"\xff\xfe 3\n"], ids=["no count", "not UTF-8"])
def test_a_srcdict_that_is_not_a_dictionary_is_one_line_naming_it(tmp_path: Path, content: bytes):
    (tmp_path / "train.en").write_text("a b\n")
    (tmp_path / "train.de").write_text("c d\n")
    srcdict = tmp_path / "dict.txt"
    srcdict.write_bytes(content)
    with pytest.raises(PreprocessError) as error:
        binarize(str(tmp_path / "bin"), "en", "de", trainpref=str(tmp_path / "train"),
                 srcdict=str(srcdict))
    message = str(error.value)
    assert message.startswith(f"--srcdict {srcdict}: not a fairseq dictionary (") and "\n" not in message


@pytest.mark.parametrize("dtype", [np.uint16, np.int32])
def test_the_index_is_fairseqs_written_a_chunk_at_a_time(tmp_path: Path, dtype):
    """write_index writes what fairseq's Index.writer writes for the same lengths, chunk after
    chunk, with byte offsets past 2 GiB and 4 GiB (int64, where int32 sums would wrap), an
    empty chunk among them; and fairseq reads it back."""
    chunks = [np.array([3, 2**30, 7], dtype=np.int32), np.array([], dtype=np.int32),
              np.array([2**30, 1, 2**30 - 1, 4], dtype=np.int32)]
    with MMapIndexedDataset.Index.writer(tmp_path / "fairseq.idx", dtype) as index:
        index.write(np.concatenate(chunks).tolist())
    write_index(str(tmp_path / "ours.idx"), dtype, chunks)
    assert (tmp_path / "ours.idx").read_bytes() == (tmp_path / "fairseq.idx").read_bytes()
    pointer, size = MMapIndexedDataset.Index(str(tmp_path / "ours.idx"))[6]
    assert (pointer, size) == ((3 * 2**30 + 10) * np.dtype(dtype).itemsize, 4) and pointer > 2**32
