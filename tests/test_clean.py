"""Cleaning in worker processes (preprocess/stages/clean.py) on real Multi30k text and hostile lines:
the same bytes as one process and as a plain reading of the files, errors that name the line."""
import itertools
import logging
import os
from pathlib import Path

import pytest

from conftest import DATA
from convs2s_preprocess.runtime import parallel, progress, pool
from convs2s_preprocess.stages import clean
from convs2s_preprocess.stages.clean import clean_corpus, keep_pair
from convs2s_preprocess.errors import PreprocessError
from convs2s_preprocess.textio import check_parallel, read_lines

MULTI30K = DATA / "multi30k"
needs_data = pytest.mark.skipif(not (MULTI30K / "train.en").is_file(),
                                reason=f"Multi30k not found under {DATA} (set CONVS2S_DATA)")
REAL_PAIRS = 1500

# (source, target) lines as bytes, with their line endings: what a plain split on b"\n" and
# rstrip("\r\n") must see. Lines that str.split() breaks but a newline scan must not.
HOSTILE = [
    (b"\n", b"\n"),                                        # both empty
    (b"\n", b"Ein Hund .\n"),                              # one side empty
    (b"a dog runs .\r\n", b"ein Hund rennt .\r\n"),        # CRLF
    (b"a dog\rruns .\n", b"ein Hund\rrennt .\n"),          # a lone CR inside a line
    (b"two CRs .\r\r\n", b"zwei CRs .\r\n"),               # rstrip("\r\n") takes both
    (b"   \n", b"  \t \n"),                                # only spaces
    (b"   \n", b"Leerzeichen\n"),
    (b"a\xc2\x85b c\n", b"a b c\n"),                       # NEL: split() breaks it, lines don't
    (b"x\xe2\x80\xa8y z\n", b"x y z\n"),                   # LINE SEPARATOR
    (b"form\x0cfeed .\n", b"Seiten\x0cvorschub .\n"),
    (b"\xef\xbb\xbfbom first .\n", b"BOM zuerst .\n"),
    (b" ".join([b"long"] * 300) + b"\n", b" ".join([b"lang"] * 300) + b"\n"),  # > max_len
    (b"w" * 20_000 + b"\n", b"W" * 20_000 + b"\n"),        # one very long token: kept
    (b"short .\n", b" ".join([b"viel"] * 9) + b" .\n"),    # ratio > 1.5
]


def real_lines(lang: str, n: int) -> list:
    """The first n lines of Multi30k's training text, as bytes with their newlines."""
    with open(MULTI30K / f"train.{lang}", "rb") as f:
        return list(itertools.islice(f, n))


def write_corpus(folder: Path, last_newline: bool = False) -> tuple:
    """Real Multi30k pairs with the hostile ones among them (first, every 37 pairs, last,
    the last line without a newline); return the two paths."""
    real = [real_lines(lang, REAL_PAIRS) for lang in ("en", "de")]
    pairs = list(HOSTILE)
    for i, pair in enumerate(zip(*real)):
        pairs.append(pair)
        if i % 37 == 36:
            pairs.append(HOSTILE[(i // 37) % len(HOSTILE)])
    pairs += HOSTILE + [(b"the end , no newline .\r", b"das Ende , ohne Zeilenende .")]
    paths = folder / "in.en", folder / "in.de"
    for side, path in enumerate(paths):
        text = b"".join(pair[side] for pair in pairs)
        path.write_bytes(text + b"\n" if last_newline and side == 1 else text)
    return paths


def oracle(src: Path, tgt: Path, **options) -> tuple:
    """(source bytes, target bytes, kept, total) by the plainest reading of the files."""
    def lines(path: Path) -> list:
        pieces = path.read_bytes().split(b"\n")
        if pieces[-1] == b"":  # after the last newline: no line
            pieces.pop()
        return [piece.decode("utf-8").rstrip("\r\n") for piece in pieces]
    pairs = list(zip(lines(src), lines(tgt)))
    kept = [(s, t) for s, t in pairs if keep_pair(s, t, **options)]
    return ("".join(s + "\n" for s, _ in kept).encode(), "".join(t + "\n" for _, t in kept).encode(),
            len(kept), len(pairs))


def run(src: Path, tgt: Path, workers: int, **options) -> tuple:
    out = src.parent / "out.en", src.parent / "out.de"
    kept, total = clean_corpus(str(src), str(tgt), *map(str, out), workers=workers, **options)
    result = out[0].read_bytes(), out[1].read_bytes(), kept, total
    for path in out:
        path.unlink()
    return result


@needs_data
@pytest.mark.parametrize("last_newline", [False, True])
@pytest.mark.parametrize("chunk_lines, scan_bytes", [(3, 4096), (13, 7), (400, 64),
                                                     (clean.CHUNK_LINES, parallel.SCAN_BYTES)])
def test_workers_write_the_bytes_of_one_process_and_of_a_plain_reading(
        tmp_path, monkeypatch, caplog, chunk_lines, scan_bytes, last_newline):
    src, tgt = write_corpus(tmp_path, last_newline)
    monkeypatch.setattr(parallel, "SCAN_BYTES", scan_bytes)
    options = [{}, {"max_len": 100_000, "ratio": None}]
    expected = [oracle(src, tgt, **o) for o in options]
    assert 0 < expected[0][2] < expected[1][2] < expected[1][3]  # the rules drop some
    total = expected[0][3]
    assert total == REAL_PAIRS + 2 * len(HOSTILE) + REAL_PAIRS // 37 + 1
    single = [run(src, tgt, 1, **o) for o in options]  # one chunk, this process
    monkeypatch.setattr(clean, "CHUNK_LINES", chunk_lines)
    caplog.set_level(logging.DEBUG, logger="convs2s_preprocess.runtime.progress")  # a quick stage ends at debug
    for workers in (1, 2, 3):
        for option, want, one in zip(options, expected, single):
            assert run(src, tgt, workers, **option) == want == one, (workers, option)
    assert sorted(os.listdir(tmp_path)) == ["in.de", "in.en"]  # no part files left
    assert caplog.messages[-1].startswith(f"clean {src} / {tgt}: {total:,}/{total:,} pairs (100%)")


@needs_data
def test_parts_are_deleted_as_they_are_appended(tmp_path, monkeypatch, caplog):
    """Disk: the part files in flight at most, not a copy of the output."""
    src, tgt = write_corpus(tmp_path)
    monkeypatch.setattr(clean, "CHUNK_LINES", 3)
    monkeypatch.setattr(progress, "INTERVAL", 0)  # a progress line after every chunk
    caplog.set_level(logging.INFO)
    parts = []

    class CountParts(logging.Handler):
        def emit(self, record):  # the part folder, until the last line (it is gone then)
            for folder in (entry for entry in os.scandir(tmp_path) if entry.name[0] == "."):
                parts.append(len(os.listdir(folder)))

    handler = CountParts()
    logging.getLogger(progress.__name__).addHandler(handler)
    try:
        run(src, tgt, 2)
    finally:
        logging.getLogger(progress.__name__).removeHandler(handler)
    assert len(parts) > 500 and max(parts) <= 2 * 2 * pool.IN_FLIGHT_PER_WORKER


def first_error(src: Path, tgt: Path) -> str:
    """What reading the pairs line by line, as cleaning did in one process, fails with."""
    with pytest.raises(PreprocessError) as exc:
        for _ in zip(read_lines(str(src)), read_lines(str(tgt))):
            pass
    return str(exc.value)


@needs_data
@pytest.mark.parametrize("bad", [{"de": 1234}, {"en": 1301}, {"en": 1300}, {"en": 1, "de": 1},
                                 {"en": 1402, "de": 1401}, {"en": 1401, "de": 1401}])
def test_invalid_utf8_in_a_later_chunk_names_its_file_and_line(tmp_path, monkeypatch, bad):
    monkeypatch.setattr(clean, "CHUNK_LINES", 100)
    paths = {}
    for lang in ("en", "de"):
        lines = real_lines(lang, 2000)
        if lang in bad:
            lines[bad[lang] - 1] = "eine Kätze schläft .\n".encode("latin-1")
        paths[lang] = tmp_path / f"in.{lang}"
        paths[lang].write_bytes(b"".join(lines))
    lang, line = min(bad.items(), key=lambda item: (item[1], item[0] == "de"))  # read first
    expected = first_error(paths["en"], paths["de"])
    assert expected.startswith(f"{paths[lang]}, line {line}: not valid UTF-8")
    for workers in (2, 1):
        with pytest.raises(PreprocessError) as exc:
            clean_corpus(str(paths["en"]), str(paths["de"]),
                         str(tmp_path / "out.en"), str(tmp_path / "out.de"), workers=workers)
        assert str(exc.value) == expected
        assert "\n" not in str(exc.value)
        assert not [name for name in os.listdir(tmp_path) if name.startswith(".")]  # parts gone


@pytest.mark.parametrize("src_text, tgt_text", [
    (b"one\ntwo\nthree\n", b"eins\nzwei\n"),
    (b"one\ntwo\nthree", b"eins\nzwei\n"),
    (b"one\ntwo\n\n", b"eins\nzwei\n"),
    (b"one\ntwo\n", b"eins\nzwei\ndrei"),
    (b"one\r\ntwo\r\n", b"eins\rzwei\r\n"),
    (b"", b"\n"),
])
def test_files_of_different_lengths_fail_as_before(tmp_path, monkeypatch, src_text, tgt_text):
    monkeypatch.setattr(clean, "CHUNK_LINES", 1)
    src, tgt = tmp_path / "a.en", tmp_path / "a.de"
    src.write_bytes(src_text)
    tgt.write_bytes(tgt_text)
    with pytest.raises(PreprocessError) as before:
        check_parallel(str(src), str(tgt))
    with pytest.raises(PreprocessError) as exc:
        clean_corpus(str(src), str(tgt), str(tmp_path / "o.en"), str(tmp_path / "o.de"), workers=2)
    assert str(exc.value) == str(before.value)
    assert sorted(os.listdir(tmp_path)) == ["a.de", "a.en"]


@pytest.mark.parametrize("text", [b"", b"\n\n", b"   \r\n\n"])
def test_every_pair_dropped_fails_and_leaves_no_parts(tmp_path, monkeypatch, text):
    monkeypatch.setattr(clean, "CHUNK_LINES", 1)
    src, tgt = tmp_path / "a.en", tmp_path / "a.de"
    src.write_bytes(text)
    tgt.write_bytes(text)
    pairs = text.count(b"\n")
    with pytest.raises(PreprocessError, match=f"cleaning dropped all {pairs} pairs"):
        clean_corpus(str(src), str(tgt), str(tmp_path / "o.en"), str(tmp_path / "o.de"), workers=2)
    assert sorted(os.listdir(tmp_path)) == ["a.de", "a.en", "o.de", "o.en"]
