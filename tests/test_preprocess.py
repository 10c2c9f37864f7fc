"""Tests of the preprocess package on real parallel text (Multi30k, RO-STS), no mocks."""
import contextlib
import hashlib
import io
import itertools
import json
import logging
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from sacremoses import MosesPunctNormalizer, MosesTokenizer
from subword_nmt.learn_bpe import learn_bpe

from conftest import BIN, DATA, ROOT
from convs2s_preprocess.runtime.atomic import RECENT_SECONDS, record_path, run_step, temp_path
from convs2s_preprocess.stages.binarize import binarize
from convs2s_preprocess.stages.bpe import apply_bpe_file, learn_joint_bpe, remove_bpe, remove_bpe_file
from convs2s_preprocess.stages.clean import clean_corpus, keep_pair
from convs2s_preprocess.errors import PreprocessError
from convs2s_preprocess.pipeline import prepare
from convs2s_preprocess.stages.postprocess import postprocess
from convs2s_preprocess.stages.romanian import normalise_romanian, normalize_romanian_line, remove_diacritics
from convs2s_preprocess.textio import count_lines, read_lines
from convs2s_preprocess.stages.tokenize import (detokenize_file, guarded, normalize_and_tokenize, normalize_punctuation,
                                                required_literal, tokenize, tokenize_file)

MULTI30K = DATA / "multi30k"
RO_STS = DATA / "ro-sts-en-ro"
needs_data = pytest.mark.skipif(not MULTI30K.is_dir() or not RO_STS.is_dir(),
                                reason=f"parallel text not found under {DATA} (set CONVS2S_DATA)")


def head(src: Path, n: int, dst: Path) -> Path:
    """The first n lines of a corpus file, copied to a temporary file."""
    with open(src, encoding="utf-8") as f:
        dst.write_text("".join(line for _, line in zip(range(n), f)), encoding="utf-8")
    return dst


def raw_pair(tmp_path: Path, split: str, n: int, name: str = None, folder: Path = MULTI30K,
             langs=("en", "de")) -> str:
    """Copy n lines of both sides of a split into tmp_path; return the file prefix."""
    prefix = tmp_path / (name or split)
    for lang in langs:
        head(folder / f"{split}.{lang}", n, Path(f"{prefix}.{lang}"))
    return str(prefix)


# --- tokenization, BPE, detokenization -------------------------------------------------

@needs_data
def test_tokenize_bpe_detokenize_round_trip(tmp_path):
    prefix = raw_pair(tmp_path, "train", 500)
    for lang in ("en", "de"):
        tokenize_file(f"{prefix}.{lang}", f"{prefix}.tok.{lang}", lang)
    learn_joint_bpe([f"{prefix}.tok.en", f"{prefix}.tok.de"], str(tmp_path / "codes"), 300)
    assert count_lines(tmp_path / "codes") == 301  # "#version" header + 300 merges

    for lang in ("en", "de"):
        tok, bpe = f"{prefix}.tok.{lang}", f"{prefix}.bpe.{lang}"
        apply_bpe_file(str(tmp_path / "codes"), tok, bpe, workers=2)
        assert "@@ " in Path(bpe).read_text(encoding="utf-8")
        remove_bpe_file(bpe, f"{prefix}.nobpe.{lang}")
        assert list(read_lines(f"{prefix}.nobpe.{lang}")) == list(read_lines(tok))

        detokenize_file(tok, f"{prefix}.detok.{lang}", lang)
        raw = [normalize_punctuation(line, lang) for line in read_lines(f"{prefix}.{lang}")]
        detok = list(read_lines(f"{prefix}.detok.{lang}"))
        same = sum(a == b for a, b in zip(raw, detok))
        # Moses detokenization is not an exact inverse (e.g. German "Disney's"), but nearly.
        assert len(detok) == 500 and same >= 490, (lang, same)

    assert next(read_lines(f"{prefix}.tok.en")) == \
        "Two young , White males are outside near many bushes ."


@needs_data
def test_bpe_codes_are_subword_nmts_on_the_text_for_any_workers(tmp_path, caplog):
    """Words counted in parallel and handed over as a dictionary give the codes subword-nmt
    learns from the concatenated text itself (the order of words of equal counts matters)."""
    paths = [head(MULTI30K / f"train.{lang}", 3000, tmp_path / f"train.{lang}") for lang in ("en", "de")]
    with open(tmp_path / "reference", "w", encoding="utf-8") as codes, \
            contextlib.redirect_stderr(io.StringIO()):
        learn_bpe(itertools.chain.from_iterable(map(read_lines, paths)), codes, 800)
    caplog.set_level(logging.DEBUG, logger="convs2s_preprocess.runtime.progress")  # a quick stage ends at debug
    for workers in (1, 2):
        learn_joint_bpe(paths, str(tmp_path / f"codes{workers}"), 800, workers=workers)
        assert (tmp_path / f"codes{workers}").read_text() == (tmp_path / "reference").read_text()
    assert "learn BPE: 800/800 merges (100%)" in caplog.text and "\r" not in caplog.text


@pytest.mark.skipif(not (DATA / "wmt14-en-de").is_dir(), reason=f"WMT14 test sets not found under {DATA}")
@pytest.mark.parametrize("folder, name, lang, romanian", [
    ("wmt14-en-de", "newstest2014", "en", False), ("wmt14-en-fr", "newstest2014", "fr", False),
    ("wmt14-en-de", "newstest2014", "de", False), ("wmt16-en-ro", "newsdev2016", "ro", True)])
def test_tokenization_is_sacremoses_line_by_line(tmp_path, folder, name, lang, romanian):
    """The compiled normalizer, the tokenizer's cached sets and the batches on 2 workers
    give the text of sacremoses' own classes applied line by line, on real news text."""
    normalizer, tokenizer = MosesPunctNormalizer(lang), MosesTokenizer(lang)
    raw = DATA / folder / f"{name}.{lang}"
    expected = []
    for line in itertools.islice(read_lines(str(raw)), 1500):
        line = normalizer.normalize(line)
        line = normalize_romanian_line(line) if romanian else line
        expected.append(tokenizer.tokenize(line, aggressive_dash_splits=True, escape=False,
                                           return_str=True))
    head(raw, 1500, tmp_path / "raw")
    tokenize_file(str(tmp_path / "raw"), str(tmp_path / "tok"), lang, romanian, workers=2)
    assert list(read_lines(str(tmp_path / "tok"))) == expected


def test_required_literal_is_only_a_character_every_match_needs():
    """The guard that lets the tokenizer skip a rule is sound: a character is named only
    where no match can lack it (not under a repeat, an alternative, a look-around, or
    case-insensitive), and a guarded rule leaves a line without it unchanged."""
    needs = {r"(\d)\xa0(\d)": "\xa0", r"\(": "(", "([^a])[']([^a])": "'", r"(?:x)?y": "y",
             r"(?=q)z": "z", r"(?i:k)m": "m", r"^``": "`"}
    for pattern, literal in needs.items():
        assert required_literal(pattern) == literal, pattern
    for pattern in (r"[\000-\037]", r"a|b", r"x?", r" +", r"(?i)k", r"(?i:k)", r"(?=q)", r"\s+"):
        assert required_literal(pattern) is None, pattern
    rule = guarded(r"([^a])[']([^a])")
    assert rule.sub(r"\1 ' \2", "no quote here") == "no quote here"
    assert rule.sub(r"\1 ' \2", "x ' y") == "x  '  y"


def test_tokenizer_splits_dashes_and_does_not_escape():
    assert tokenize("A well-known band & its fans.", "en") == \
        "A well @-@ known band & its fans ."


def test_remove_bpe_is_the_sed_expression():
    assert remove_bpe("the d@@ og bark@@ s lou@@") == "the dog barks lou"
    assert remove_bpe("lou@@ ") == "lou"


def test_postprocess_removes_bpe_and_detokenizes():
    assert postprocess("Ein Hund , der @-@ sp@@ ielt .", "de") == "Ein Hund, der-spielt."


# --- Romanian -----------------------------------------------------------------------------

def test_romanian_character_maps():
    cedilla = "\u015e\u015f\u0162\u0163"  # Ş ş Ţ ţ
    comma = "\u0218\u0219\u021a\u021b"    # Ș ș Ț ț
    assert normalise_romanian(cedilla + " ăâî") == comma + " ăâî"
    assert remove_diacritics(comma + "ĂăÂâÎî") == "SsTtAaAaIi"
    # remove-diacritics.py assumes normalised input: cedilla forms alone pass through
    assert remove_diacritics(cedilla) == cedilla
    assert normalize_romanian_line("Ştiinţă şi învăţământ") == "Stiinta si invatamant"


@needs_data
def test_romanian_normalization_on_real_text(tmp_path):
    raw = head(RO_STS / "train.ro", 300, tmp_path / "raw.ro")
    diacritics = re.compile("[\u0218\u0219\u021a\u021b\u015e\u015f\u0162\u0163ĂăÂâÎî]")
    assert diacritics.search(raw.read_text(encoding="utf-8"))
    tokenize_file(str(raw), str(tmp_path / "tok.ro"), "ro", romanian=True)
    tokenized = (tmp_path / "tok.ro").read_text(encoding="utf-8")
    assert not diacritics.search(tokenized)
    assert count_lines(tmp_path / "tok.ro") == 300
    # without the flag the diacritics stay
    assert diacritics.search(normalize_and_tokenize(next(read_lines(str(raw))) + " ş", "ro"))


# --- cleaning -------------------------------------------------------------------------------

def test_keep_pair_rules():
    assert keep_pair("a b c", "x y z")
    assert not keep_pair("", "x") and not keep_pair("a", "   ")
    assert not keep_pair(" ".join(["w"] * 176), " ".join(["w"] * 176))
    assert keep_pair(" ".join(["w"] * 175), " ".join(["w"] * 175))
    assert not keep_pair("a b c d", "x y z", max_len=3)
    assert keep_pair("a b c", "x y")                   # 1.5 exactly is kept
    assert not keep_pair("a b c d", "x y")             # source 2x longer
    assert not keep_pair("a b", "w x y z")             # target 2x longer
    assert keep_pair("a b c d", "x y", ratio=2.0)
    assert keep_pair("a b c d e f", "x", ratio=None)   # ratio filter off


@needs_data
def test_clean_corpus_on_real_lines(tmp_path):
    prefix = raw_pair(tmp_path, "val", 100)
    for lang in ("en", "de"):
        tokenize_file(f"{prefix}.{lang}", f"{prefix}.tok.{lang}", lang)
    src, tgt = (list(read_lines(f"{prefix}.tok.{lang}")) for lang in ("en", "de"))
    expected = [i for i in range(100) if keep_pair(src[i], tgt[i])]
    assert 90 <= len(expected) < 100  # real data: a few pairs exceed ratio 1.5
    bad = [("", tgt[0]), (src[1], ""), (" ".join(src * 2), " ".join(tgt * 2)),
           (src[2] + " " + src[2] + " " + src[2], tgt[2]), (src[3], " ".join([tgt[3]] * 3))]
    (tmp_path / "in.en").write_text("\n".join(src + [s for s, _ in bad]) + "\n", encoding="utf-8")
    (tmp_path / "in.de").write_text("\n".join(tgt + [t for _, t in bad]) + "\n", encoding="utf-8")

    out = [str(tmp_path / f"out.{lang}") for lang in ("en", "de")]
    kept, total = clean_corpus(str(tmp_path / "in.en"), str(tmp_path / "in.de"), *out)
    assert (kept, total) == (len(expected), 105)
    assert list(read_lines(out[0])) == [src[i] for i in expected]
    assert list(read_lines(out[1])) == [tgt[i] for i in expected]

    kept, _ = clean_corpus(str(tmp_path / "in.en"), str(tmp_path / "in.de"), *out,
                           max_len=10_000, ratio=None)
    assert kept == 103  # only the two pairs with an empty side go


def test_mismatched_line_counts_name_both_files(tmp_path):
    (tmp_path / "a.en").write_text("one\ntwo\nthree\n", encoding="utf-8")
    (tmp_path / "a.de").write_text("eins\nzwei\n", encoding="utf-8")
    with pytest.raises(PreprocessError) as exc:
        clean_corpus(str(tmp_path / "a.en"), str(tmp_path / "a.de"),
                     str(tmp_path / "o.en"), str(tmp_path / "o.de"))
    message = str(exc.value)
    assert f"{tmp_path / 'a.en'} has 3 lines" in message
    assert f"{tmp_path / 'a.de'} has 2 lines" in message


def test_non_utf8_input_names_file_line_and_fix(tmp_path):
    (tmp_path / "a.en").write_text("a dog .\na cat .\nthe end .\n", encoding="utf-8")
    (tmp_path / "a.de").write_bytes("ein Hund .\n".encode() + "eine Kätze .\n".encode("latin-1")
                                    + b"das Ende .\n")
    with pytest.raises(PreprocessError) as exc:
        clean_corpus(str(tmp_path / "a.en"), str(tmp_path / "a.de"),
                     str(tmp_path / "o.en"), str(tmp_path / "o.de"))
    message = str(exc.value)
    assert f"{tmp_path / 'a.de'}, line 2: not valid UTF-8" in message
    assert "iconv" in message
    # the same error when the lines are tokenized by a pool of processes
    with pytest.raises(PreprocessError, match="a.de, line 2: not valid UTF-8"):
        tokenize_file(str(tmp_path / "a.de"), str(tmp_path / "o.de"), "de", workers=2)


# --- atomic steps that know what they were built from --------------------------------------

def _write_half_then_fail(out: str) -> None:
    with open(out, "w") as f:
        f.write("half of the output\n")
    raise RuntimeError("step failed halfway")


def _upper(inp: Path, calls: list = None):
    """A step action: write the input in capitals."""
    def action(out: str) -> None:
        if calls is not None:
            calls.append(out)
        Path(out).write_text(inp.read_text().upper())
    return action


def _step(inp: Path, out: Path, calls: list = None, **options) -> bool:
    return run_step("demo", [str(inp)], [str(out)], _upper(inp, calls), options)


def test_failed_step_leaves_no_output_and_reruns(tmp_path):
    inp, out = tmp_path / "in.txt", tmp_path / "out.txt"
    inp.write_text("data\n")
    with pytest.raises(RuntimeError, match="halfway"):
        run_step("demo", [str(inp)], [str(out)], _write_half_then_fail)
    assert os.listdir(tmp_path) == ["in.txt"]  # neither output, temporary file nor record

    assert _step(inp, out)
    assert out.read_text() == "DATA\n"


def test_killed_step_leaves_no_record_and_rerun_cleans(tmp_path):
    inp, out = tmp_path / "in.txt", tmp_path / "out.txt"
    record = Path(record_path([str(out)]))
    script = textwrap.dedent(f"""
        import os, signal
        from convs2s_preprocess.runtime.atomic import run_step
        def action(temp):
            with open(temp, "w") as f:
                f.write("partial\\n")
                f.flush()
                os.kill(os.getpid(), signal.SIGKILL)
        run_step("demo", [{str(inp)!r}], [{str(out)!r}], action)
    """)
    inp.write_text("data\n")
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT)
    assert proc.returncode == -9
    assert not out.exists() and not record.exists() and Path(temp_path(str(out))).exists()
    assert _step(inp, out)
    assert out.read_text() == "DATA\n"
    assert sorted(os.listdir(tmp_path)) == [record.name, "in.txt", "out.txt"]

    # Killed while rebuilding for a changed input: the earlier output and its record stay,
    # the record still describes that output, and the rerun rebuilds.
    built = record.read_text()
    inp.write_text("new data\n")
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT)
    assert proc.returncode == -9
    assert out.read_text() == "DATA\n" and record.read_text() == built
    assert _step(inp, out)
    assert out.read_text() == "NEW DATA\n"


def test_step_is_reused_only_while_inputs_options_and_outputs_are_unchanged(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="convs2s_preprocess.runtime.atomic")
    inp, out = tmp_path / "in.txt", tmp_path / "out.txt"
    inp.write_text("data\n")
    calls = []
    assert _step(inp, out, calls, n=1)
    assert not _step(inp, out, calls, n=1)
    assert "demo: reused" in caplog.text and len(calls) == 1
    os.utime(inp)  # a new mtime with the same content: content decides
    assert not _step(inp, out, calls, n=1)

    # Replaced in place with the same size and the same mtime: still noticed.
    stat = inp.stat()
    inp.write_text("atad\n")
    os.utime(inp, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert inp.stat().st_size == stat.st_size
    assert _step(inp, out, calls, n=1)
    assert f"demo: rebuilding: {inp} changed" in caplog.text
    assert out.read_text() == "ATAD\n"

    assert _step(inp, out, calls, n=2)
    assert "demo: rebuilding: options changed: n: 1 -> 2" in caplog.text

    out.write_text("TAMPERED\n")
    assert _step(inp, out, calls, n=2)
    assert f"demo: rebuilding: {out} modified since it was built" in caplog.text
    assert out.read_text() == "ATAD\n"
    out.unlink()
    assert _step(inp, out, calls, n=2)
    assert f"demo: rebuilding: {out} missing" in caplog.text

    # The same content under another path is the same input.
    other = tmp_path / "other.txt"
    other.write_text("atad\n")
    assert not _step(other, out, calls, n=2)
    assert len(calls) == 5


def test_outputs_without_a_record_are_rebuilt(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="convs2s_preprocess.runtime.atomic")
    inp, out = tmp_path / "in.txt", tmp_path / "out.txt"
    inp.write_text("data\n")
    out.write_text("written by an older version\n")
    assert _step(inp, out)
    assert f"demo: rebuilding: no record of what built {out}" in caplog.text
    assert out.read_text() == "DATA\n"


def test_failed_rebuild_keeps_the_earlier_output_and_its_record(tmp_path):
    inp, out = tmp_path / "in.txt", tmp_path / "out.txt"
    inp.write_text("data\n")
    assert _step(inp, out)

    def fail(temp):
        raise PreprocessError("the new input is wrong")

    inp.write_text("wrong\n")
    with pytest.raises(PreprocessError) as exc:
        run_step("demo", [str(inp)], [str(out)], fail)
    assert f"demo failed: {out} left as an earlier run wrote them, not built from these" \
        in str(exc.value)
    assert out.read_text() == "DATA\n"
    # The record still says truthfully what that output was built from.
    inp.write_text("data\n")
    assert not _step(inp, out)


def test_record_keeps_stat_only_of_files_that_changed_long_enough_ago(tmp_path):
    old, new, out = tmp_path / "old.txt", tmp_path / "new.txt", tmp_path / "out.txt"
    old.write_text("old\n")
    time.sleep(RECENT_SECONDS + 0.1)
    new.write_text("new\n")
    run_step("demo", [str(old), str(new)], [str(out)], _upper(old))
    record = json.loads(Path(record_path([str(out)])).read_text())
    (old_entry,), (new_entry,) = (entry["files"].values() for entry in record["inputs"])
    stat = old.stat()
    assert old_entry["stat"] == [stat.st_ino, 4, stat.st_mtime_ns, stat.st_ctime_ns]
    assert new_entry["stat"] is None  # a second write within the same tick could hide
    assert old_entry["sha256"] == hashlib.sha256(b"old\n").hexdigest()

    # Same inode, size and mtime, other bytes: the ctime gives the rewrite away.
    old.write_text("OLD\n")
    os.utime(old, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert run_step("demo", [str(old), str(new)], [str(out)], _upper(old))
    assert out.read_text() == "OLD\n"


def test_empty_or_missing_input_is_an_error_naming_the_file(tmp_path):
    empty = tmp_path / "train.en"
    empty.write_text("")
    with pytest.raises(PreprocessError, match=f"input corpus is empty: {empty}"):
        run_step("demo", [str(empty)], [str(tmp_path / "out")], lambda o: None)
    with pytest.raises(PreprocessError, match="input file not found: .*missing.en"):
        run_step("demo", [str(tmp_path / "missing.en")], [str(tmp_path / "out")], lambda o: None)


# --- binarization and the whole pipeline ----------------------------------------------------

def test_binarize_missing_input_names_the_file(tmp_path):
    with pytest.raises(PreprocessError, match=r"input file not found: .*missing\.en"):
        binarize(str(tmp_path / "bin"), "en", "de", trainpref=str(tmp_path / "missing"))


@needs_data
@pytest.mark.parametrize("options", [[], ["--nwordssrc", "3000", "--nwordstgt", "3000"]],
                         ids=["joined", "separate-nwords"])
def test_binarize_is_fairseq_preprocess_for_any_workers(tmp_path, options):
    """The files of fairseq-preprocess, byte for byte, with 1 or 2 workers (fairseq's own
    pool would leave one of 2 idle)."""
    train, valid = raw_pair(tmp_path, "train", 3000), raw_pair(tmp_path, "val", 300)
    joined = not options
    subprocess.run([str(BIN / "fairseq-preprocess"), "--source-lang", "en", "--target-lang", "de",
                    "--trainpref", train, "--validpref", valid, "--destdir", str(tmp_path / "ref"),
                    *(["--joined-dictionary"] if joined else options)],
                   check=True, capture_output=True)
    reference = _outputs(tmp_path / "ref")
    assert len(reference) == 2 + 2 * 2 * 2  # dictionaries, {train,valid} x {en,de} x {bin,idx}
    for workers in ((1, 2) if joined else (2,)):
        out = tmp_path / f"workers{workers}"
        binarize(str(out), "en", "de", trainpref=train, validpref=valid, workers=workers,
                 joined_dictionary=joined, nwords=3000 if options else -1)
        assert _outputs(out) == reference, workers


def _fairseq_counts(log: Path) -> dict:
    """{file: (sentences, tokens)} from the lines of fairseq-preprocess's preprocess.log."""
    pattern = re.compile(r"\] (\S+): (\d+) sents, (\d+) tokens")
    return {m[1]: (int(m[2]), int(m[3])) for m in pattern.finditer(log.read_text())}


def _run_prepare(*args: str) -> subprocess.CompletedProcess:
    """convs2s-prepare with its stderr in a pipe, not a terminal, and a progress line for every
    batch of work."""
    return subprocess.run([sys.executable, "-m", "convs2s_preprocess.pipeline", *args], cwd=ROOT,
                          capture_output=True, text=True,
                          env=dict(os.environ, CONVS2S_PROGRESS_SECONDS="0"))


@needs_data
def test_prepare_multi30k_end_to_end(tmp_path):
    train = raw_pair(tmp_path, "train", 2000)
    valid = raw_pair(tmp_path, "val", 200)
    test = raw_pair(tmp_path, "test_2016_flickr", 200, name="test")
    out = tmp_path / "out"
    args = ["-s", "en", "-t", "de", "--trainpref", train, "--validpref", valid,
            "--testpref", test, "-o", str(out), "--bpe-merges", "1000", "--workers", "2"]
    proc = _run_prepare(*args)
    assert proc.returncode == 0, proc.stderr

    kept = count_lines(out / "tok" / "train.clean.en")
    assert 1900 < kept < 2000 and count_lines(out / "tok" / "train.clean.de") == kept
    assert count_lines(out / "bpe" / "codes") == 1001
    bindir = out / "bin"
    dict_en, dict_de = (bindir / f"dict.{lang}.txt" for lang in ("en", "de"))
    assert dict_en.read_text() == dict_de.read_text()  # --joined-dictionary
    assert 1000 < count_lines(dict_en) < 1300  # ~1000 merges + characters
    counts = _fairseq_counts(bindir / "preprocess.log")
    for split in ("train", "valid", "test"):
        for lang in ("en", "de"):
            assert (bindir / f"{split}.en-de.{lang}.bin").stat().st_size > 0
            assert (bindir / f"{split}.en-de.{lang}.idx").stat().st_size > 0
            text = out / "bpe" / f"{split}.{lang}"
            lines = list(read_lines(str(text)))
            tokens = sum(len(line.split()) + 1 for line in lines)  # + end of sentence
            assert counts[str(text)] == (len(lines), tokens)
            # The evaluation splits' text is kept beside the binaries as fairseq's raw text.
            raw = bindir / f"{split}.en-de.{lang}"
            if split == "train":
                assert not raw.exists()
            else:
                assert raw.read_text(encoding="utf-8") == text.read_text(encoding="utf-8")
    assert counts[str(out / "bpe" / "train.en")][0] == kept
    # Each long stage logs its progress with its rate (and, before the end, the time left);
    # written to a pipe, the log holds lines, not carriage-return bars.
    assert re.search(r"\| learn BPE: \d{3}/1,000 merges \(\d\d%\), [\d,]+ merges/s, about "
                     r"\d+:\d\d:\d\d left\n", proc.stderr), proc.stderr
    assert "| learn BPE: 1,000/1,000 merges (100%)" in proc.stderr
    for stage in (f"tokenize {train}.de: 2,000/2,000 lines", f"apply BPE to {out}/tok/valid.en: 200/200 lines",
                  f"binarize {out}/bpe/train.en: {kept:,}/{kept:,} lines", "count words for BPE: "):
        assert re.search(re.escape(stage) + r".*, [\d,]+ \w+/s in \d", proc.stderr), stage
    assert "\r" not in proc.stderr
    assert not list(out.rglob(".*.tmp"))  # no temporary files left
    assert len(list(out.rglob(".*.built-from.json"))) == 9  # one record per step

    # A rerun reuses every step and rewrites none of the outputs.
    mtimes = {p: p.stat().st_mtime_ns for p in out.rglob("*")
              if p.is_file() and p.name[0] != "."}
    proc = _run_prepare(*args)
    assert proc.returncode == 0, proc.stderr
    # 3 x tokenize, clean, learn BPE, 3 x apply BPE, binarize
    assert proc.stderr.count(": reused, inputs and options unchanged") == 9
    assert {p: p.stat().st_mtime_ns for p in mtimes} == mtimes

    # Other options on the same directory rebuild what they affect, and only that.
    proc = _run_prepare(*args[:-4], "--bpe-merges", "500", "--workers", "2")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count(": reused, inputs and options unchanged") == 4  # tokenize, clean
    assert "learn BPE: rebuilding: options changed: merges: 1000 -> 500" in proc.stderr
    assert f"apply BPE test: rebuilding: {out / 'bpe' / 'codes'} changed" in proc.stderr
    assert f"binarize: rebuilding: {out / 'bpe' / 'train.en'} changed" in proc.stderr
    assert count_lines(out / "bpe" / "codes") == 501
    assert 500 < count_lines(dict_en) < 800
    assert json.loads((out / "prepare.json").read_text())["bpe_merges"] == 500


@needs_data
def test_prepare_word_level_romanian(tmp_path):
    train = raw_pair(tmp_path, "train", 400, folder=RO_STS, langs=("en", "ro"))
    bindir = prepare(str(tmp_path / "out"), "en", "ro", train, romanian=True, bpe_merges=None,
                     ratio=None, max_len=12)
    assert not (tmp_path / "out" / "bpe").exists()
    options = json.loads((tmp_path / "out" / "prepare.json").read_text())
    assert options["bpe_merges"] is None and options["romanian"] is True
    words = {line.split()[0] for line in read_lines(os.path.join(bindir, "dict.ro.txt"))}
    assert "si" in words and "și" not in words  # "și" (and) without diacritics
    assert not any("@@" in word for word in words)
    tokenized = list(read_lines(str(tmp_path / "out" / "tok" / "train.clean.en")))
    assert 0 < len(tokenized) < 400 and max(len(line.split()) for line in tokenized) <= 12


def _write_lines(path: str, lines: list) -> None:
    Path(path).write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def _corpus_lines(split: str, lang: str, start: int, stop: int) -> list:
    with open(MULTI30K / f"{split}.{lang}", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in itertools.islice(f, start, stop)]


def _outputs(outdir: Path) -> dict:
    """{relative path: bytes} of what prepare wrote, less records and fairseq's log."""
    return {str(p.relative_to(outdir)): p.read_bytes() for p in sorted(outdir.rglob("*"))
            if p.is_file() and p.name[0] != "." and p.name not in ("preprocess.log",
                                                                    "prepare.json")}


@needs_data
def test_prepare_follows_a_corpus_replaced_in_place(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="convs2s_preprocess.runtime.atomic")
    train = raw_pair(tmp_path, "train", 300)
    valid = raw_pair(tmp_path, "val", 100)
    out = tmp_path / "out"
    prepare(str(out), "en", "de", train, valid, bpe_merges=200)
    before = _outputs(out)

    # The same paths, other sentences: every step that reads them, directly or not, runs.
    for lang in ("en", "de"):
        _write_lines(f"{train}.{lang}", _corpus_lines("train", lang, 300, 600))
    caplog.clear()
    prepare(str(out), "en", "de", train, valid, bpe_merges=200)
    log = caplog.text
    assert f"tokenize train: rebuilding: {train}.en changed; {train}.de changed" in log
    assert "tokenize valid: reused" in log
    for step in ("clean train", "learn BPE", "apply BPE train", "apply BPE valid", "binarize"):
        assert f"{step}: rebuilding: " in log
    after = _outputs(out)
    assert after["tok/valid.en"] == before["tok/valid.en"]
    for changed in ("tok/train.en", "tok/train.clean.de", "bpe/codes", "bpe/valid.en",
                    "bin/dict.en.txt", "bin/train.en-de.de.bin", "bin/valid.en-de.en"):
        assert after[changed] != before[changed], changed
    # Exactly what a fresh directory gets from the new corpus.
    fresh = tmp_path / "fresh"
    prepare(str(fresh), "en", "de", train, valid, bpe_merges=200)
    assert after == _outputs(fresh)

    # A file changed inside bin/ (a directory output) is noticed too.
    (out / "bin" / "train.en-de.en.bin").write_bytes(b"tampered")
    caplog.clear()
    prepare(str(out), "en", "de", train, valid, bpe_merges=200)
    assert f"binarize: rebuilding: {out / 'bin'} modified since it was built" in caplog.text
    assert caplog.text.count(": reused") == 6
    assert _outputs(out) == after


@needs_data
def test_corrected_corpus_is_not_shadowed_by_old_tokenized_text(tmp_path):
    train = raw_pair(tmp_path, "train", 200)
    good = _corpus_lines("train", "de", 0, 200)
    # A broken target side: every line three times over, so cleaning drops every pair.
    _write_lines(f"{train}.de", [" ".join([line] * 3) for line in good])
    with pytest.raises(PreprocessError, match="cleaning dropped all 200 pairs"):
        prepare(str(tmp_path / "out"), "en", "de", train, bpe_merges=None)
    _write_lines(f"{train}.de", good)  # corrected in place
    bindir = prepare(str(tmp_path / "out"), "en", "de", train, bpe_merges=None)
    assert 150 < count_lines(str(tmp_path / "out" / "tok" / "train.clean.de")) <= 200
    assert os.path.exists(os.path.join(bindir, "train.en-de.de.bin"))
    assert list(read_lines(str(tmp_path / "out" / "tok" / "train.de")))[0] == \
        normalize_and_tokenize(good[0], "de")


def test_apply_bpe_reads_codes_learned_again_at_the_same_path(tmp_path):
    text, codes = str(tmp_path / "text"), str(tmp_path / "codes")
    _write_lines(text, ["lower lowest newer newest wider widest"] * 20)
    learn_joint_bpe([text], codes, 2)
    apply_bpe_file(codes, text, str(tmp_path / "few"))
    learn_joint_bpe([text], codes, 30)  # enough merges to join every word
    apply_bpe_file(codes, text, str(tmp_path / "many"))
    assert "@@" in (tmp_path / "few").read_text()
    assert (tmp_path / "many").read_text() == (tmp_path / "text").read_text()


def test_prepare_empty_training_corpus_is_an_error(tmp_path):
    for lang in ("en", "de"):
        (tmp_path / f"train.{lang}").write_text("")
    with pytest.raises(PreprocessError, match=f"input corpus is empty: {tmp_path}/train.en"):
        prepare(str(tmp_path / "out"), "en", "de", str(tmp_path / "train"))
