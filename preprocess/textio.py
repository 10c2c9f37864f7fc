"""UTF-8 line I/O for parallel corpora, with errors that name the file and the line.

Every step of the pipeline reads and writes one sentence per line, line N of one language
aligned with line N of the other (the layout of the WMT data, Sennrich's WMT16 scripts and
``fairseq-preprocess``).
"""
import os
import re
from typing import Iterable, Iterator, NamedTuple

from .errors import PreprocessError


def read_lines(path: str) -> Iterator[str]:
    """Yield the lines of a UTF-8 file without their line ending.

    The file is decoded line by line, so a byte sequence that is not UTF-8 is reported
    with its line number instead of a bare ``UnicodeDecodeError``.
    """
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            yield decode_line(raw, path, number)


def decode_line(raw: bytes, path: str, number: int) -> str:
    """Line ``number`` of ``path``, read as bytes, decoded and without its line ending; a
    line that is not UTF-8 is an error naming the file, the line and the fix."""
    try:
        return raw.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError as exc:
        raise PreprocessError(
            f"{path}, line {number}: not valid UTF-8 ({exc.reason} at byte {exc.start}: "
            f"{raw[exc.start:exc.start + 4]!r}). Fix: convert the file to UTF-8, e.g. "
            f"`iconv -f ISO-8859-1 -t UTF-8 {path} > {path}.utf8` (use the file's real "
            "encoding), or remove that line from both sides of the corpus."
        ) from None


# The control characters of C0 that are not whitespace to str.split: Moses' tokenizer deletes
# them, gluing the words they separated ("Mann\0mit\0Hut" became "MannmitHut"). Whitespace
# (tab, \x1c-\x1f) already separates words; DEL and C1 (a cp1252 dash read as Latin-1 in
# newstest2014.fr: "pompiers\x96 qui") it keeps as tokens of their own, which glue nothing, and
# so they are left as Moses leaves them (real text keeps Moses' output, byte for byte).
CONTROL = re.compile("[\x00-\x08\x0e-\x1b]")
CONTROL_BYTES = bytes([*range(0x00, 0x09), *range(0x0e, 0x1c)])  # the same, in UTF-8
BOM = "\ufeff"
# Either, or a byte-order mark at a line's start (in a block of whole lines).
SCRUBBED = re.compile(b"[\x00-\x08\x0e-\x1b]|(?:^|(?<=\n))\xef\xbb\xbf")


def scrub(line: str) -> str:
    """``line`` with each control character a space and a leading byte-order mark removed (it
    would become part of the first word); a printable line, which holds neither, unchanged."""
    if line.isprintable():
        return line
    return CONTROL.sub(" ", line[1:] if line.startswith(BOM) else line)


class Scrubbed(NamedTuple):
    """What :func:`scrub` changes in a file: control characters, byte-order marks, the first
    line changed (0: none)."""
    controls: int
    marks: int
    first_line: int


def scrubbed(path: str, block_bytes: int = 1 << 24) -> Scrubbed:
    """Count what :func:`scrub` changes in the UTF-8 file ``path``, reading its bytes in blocks
    cut after a line, so that a character or a line's start is never split."""
    controls = marks = first = lines_before = 0
    bom = BOM.encode("utf-8")
    rest = b""
    with open(path, "rb") as f:
        while True:
            block = f.read(block_bytes)
            data = rest + block
            end = data.rfind(b"\n") + 1 if block else len(data)
            chunk, rest = data[:end], data[end:]  # chunk: whole lines
            found = len(chunk) - len(chunk.translate(None, CONTROL_BYTES))
            found_marks = chunk.startswith(bom) + chunk.count(b"\n" + bom)
            if (found or found_marks) and not first:
                first = lines_before + chunk.count(b"\n", 0, SCRUBBED.search(chunk).start()) + 1
            controls, marks, lines_before = controls + found, marks + found_marks, lines_before + chunk.count(b"\n")
            if not block:
                return Scrubbed(controls, marks, first)


def write_lines(path: str, lines: Iterable[str]) -> int:
    """Write one line per item (UTF-8, ``\\n`` endings) and return how many were written."""
    count = 0
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for line in lines:
            f.write(line + "\n")
            count += 1
    return count


def spread_evenly(items: Iterable, size: int, total: int) -> Iterator:
    """``size`` of the ``total`` items, spread evenly: item i (from 0) is kept where
    ``i * size // total`` steps up. The same lines of both sides of a corpus, and every part
    of a corpus made of several sources one after the other; all items if size >= total."""
    for i, item in enumerate(items):
        if in_sample(i, size, total):
            yield item


def in_sample(i: int, size: int, total: int) -> bool:
    """Whether :func:`spread_evenly` keeps item ``i`` (from 0) of ``total``."""
    return size >= total or (i + 1) * size // total > i * size // total


def sample_option(name: str, sample: int, path: str) -> dict:
    """``{name: sample}`` where a sample of ``sample`` lines leaves some of ``path``'s out, else
    ``{}``: for a step's record, so that a sample no smaller than the corpus (which is the
    corpus) leaves the step current. A missing ``path`` gives ``{}`` (the step names it)."""
    return {name: sample} if 0 < sample and os.path.isfile(path) and sample < count_lines(path) else {}


def count_lines(path: str) -> int:
    """Number of lines, counting a last line without a newline, as :func:`read_lines` does."""
    with open(path, "rb") as f:
        return sum(1 for _ in f)


def check_parallel(src_path: str, tgt_path: str) -> int:
    """Return the number of sentence pairs, or fail if the two sides differ in length."""
    src_count, tgt_count = count_lines(src_path), count_lines(tgt_path)
    if src_count != tgt_count:
        raise PreprocessError(
            f"parallel files differ in length: {src_path} has {src_count} lines, "
            f"{tgt_path} has {tgt_count} lines. Line N of one side must translate line N of "
            "the other: fix or re-extract the corpus."
        )
    return src_count

