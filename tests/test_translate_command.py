"""convs2s-translate on a folder written by convs2s-prepare and a model trained by fairseq-train
(Multi30k en-de): raw text in, detokenized translations out, in the input's order."""
import os
import re
import subprocess

import pytest

from cli_helpers import hypotheses, run, run_killing_a_worker, write_lines
from conftest import BIN, COMMAND_TIMEOUT, ROOT
from convs2s_preprocess.stages.postprocess import postprocess
from tiny_runs import prepare, train


@pytest.fixture(scope="module")
def model(tmp_path_factory, data_dir):
    """(prepared folder with BPE, checkpoint): the test split's raw text is prepared/../raw/test.en."""
    work = tmp_path_factory.mktemp("translate")
    prepared = prepare(data_dir, work, "--bpe-merges", "500")
    train(prepared / "bin", work / "checkpoints", "--task", "convs2s_translation", "--max-update", "30")
    return prepared, work / "checkpoints" / "checkpoint_last.pt"


def translate(checkpoint, prepared, *options, stdin=None, threads=None):
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)} if threads else None
    return subprocess.run([str(BIN / "convs2s-translate"), "--path", str(checkpoint), "--data", str(prepared),
                           *map(str, options)], input=stdin, capture_output=True, text=True, cwd=ROOT,
                          timeout=COMMAND_TIMEOUT, env=env)


def test_translations_are_fairseq_generates_for_the_prepared_split(model, tmp_path):
    """Raw test lines through convs2s-translate give fairseq-generate's hypotheses of the split
    that convs2s-prepare made of the same lines, BPE removed and detokenized, in the input's
    order; reading a few lines at a time changes nothing."""
    prepared, checkpoint = model
    generated = hypotheses(run("fairseq-generate", prepared / "bin", "--user-dir", ROOT / "fairseq_convs2s_ext",
                               "--task", "convs2s_translation", "--path", checkpoint, "--gen-subset", "test",
                               "--beam", 5, "--batch-size", 128))
    expected = [postprocess(generated[i], "de") for i in range(len(generated))]
    raw = prepared.parent / "raw" / "test.en"
    out = tmp_path / "test.de"
    done = translate(checkpoint, prepared, "-i", raw, "-o", out, "--beam", 5)
    assert done.returncode == 0, done.stderr
    assert out.read_text(encoding="utf-8").splitlines() == expected
    assert re.search(r"convs2s-translate: 20 sentences in [\d.]+ s: [\d.]+ sentences/s", done.stderr), done.stderr
    chunked = translate(checkpoint, prepared, "--chunk", 7, "--batch-size", 3, stdin=raw.read_text(encoding="utf-8"))
    assert chunked.returncode == 0, chunked.stderr
    assert chunked.stdout.splitlines() == expected


def test_workers_translate_as_one_process_at_their_threads(model):
    """--workers 2 of OMP_NUM_THREADS=2: two processes of a thread each, translating the batches
    of one process side by side, write what one process of one thread writes (int8 here; the
    hub's test covers float32)."""
    prepared, checkpoint = model
    raw = (prepared.parent / "raw" / "test.en").read_text(encoding="utf-8")
    options = ("--batch-size", 3, "--chunk", 11, "--quantize", "int8", "--replace-unk", "--lenpen", 0.6)
    one = translate(checkpoint, prepared, *options, stdin=raw, threads=1)
    two = translate(checkpoint, prepared, *options, "--workers", 2, stdin=raw, threads=2)
    assert one.returncode == 0 and two.returncode == 0, one.stderr + two.stderr
    assert two.stdout == one.stdout and len(one.stdout.splitlines()) == 20
    assert "batches of 3, 1 thread" in one.stderr and "batches of 3, 2 workers of 1 thread" in two.stderr


def test_an_empty_line_stays_empty_and_int8_translates_every_line(model):
    prepared, checkpoint = model
    lines = ["A dog runs through the snow.", "", "Two men are talking on a bench."]
    done = translate(checkpoint, prepared, "--quantize", "int8", stdin="\n".join(lines) + "\n")
    assert done.returncode == 0, done.stderr
    out = done.stdout.splitlines()
    assert len(out) == 3 and out[1] == "" and out[0] and out[2]
    assert ", int8;" in done.stderr


@pytest.mark.parametrize("problem", ["no input", "not utf-8", "folder as path", "zero beam", "no workers",
                                     "long line", "no dictionary", "not a dictionary"])
def test_bad_input_is_one_line_and_writes_nothing(model, tmp_path, problem):
    prepared, checkpoint = model
    source, path, options = tmp_path / "in.en", checkpoint, []
    dictionary = tmp_path / "align.dict"
    if problem.endswith("dictionary"):  # refused before the model loads, named alone
        options = ["--replace-unk", dictionary]
    if problem == "not a dictionary":
        write_lines(dictionary, ["Hund dog", "Katze"])
    if problem == "not utf-8":
        source.write_bytes("A dog runs.\n".encode() * 3 + "Caf\xe9\n".encode("latin-1"))
    elif problem == "long line":  # in the second chunk of 2 lines: its line in the file is named
        write_lines(source, ["A dog runs."] * 3 + ["dog " * 1100])
        options = ["--chunk", 2]
    elif problem != "no input":
        write_lines(source, ["A dog runs."])
    if problem == "folder as path":
        path = checkpoint.parent
    if problem == "zero beam":
        options = ["--beam", 0]
    if problem == "no workers":
        options = ["--workers", 0]
    out = tmp_path / "out.de"
    done = subprocess.run([str(BIN / "convs2s-translate"), "--path", str(path), "--data", str(prepared),
                           "-i", str(source), "-o", str(out), *map(str, options)],
                          capture_output=True, text=True, cwd=ROOT, timeout=COMMAND_TIMEOUT)
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("convs2s-translate: error: "), done.stderr
    named = {"no input": str(source), "not utf-8": str(source), "folder as path": str(path), "zero beam": "--beam",
             "no workers": "--workers", "long line": f"{source}: line 4 is 1101 tokens long",
             "no dictionary": f"{dictionary}: no such --replace-unk dictionary",
             "not a dictionary": f"{dictionary} line 2: 'Katze' has 1 words"}
    assert named[problem] in lines[0]
    if problem not in ("no input", "not utf-8", "long line"):
        assert str(source) not in lines[0], "the input is named where it is not what is wrong"
    assert not out.exists() and sorted(tmp_path.iterdir()) == sorted(p for p in (source, dictionary) if p.exists())


def test_a_failure_on_stdout_says_which_translations_it_holds(model):
    """From stdin to stdout, a line that fails in the second chunk is named by its line in
    the input ("stdin"), and the error says that stdout holds the first chunk's translations,
    which it does, not that nothing was written."""
    prepared, checkpoint = model
    done = translate(checkpoint, prepared, "--chunk", 2, stdin="\n".join(["A dog runs."] * 3 + ["dog " * 1100]) + "\n")
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("convs2s-translate: error: stdin: line 4 is 1101 tokens long"), \
        done.stderr
    assert lines[0].endswith("; stdout has the translations of lines 1-2 only"), lines[0]
    assert len(done.stdout.splitlines()) == 2 and all(done.stdout.splitlines()), done.stdout


def test_a_worker_that_dies_is_one_line_and_writes_nothing(model, tmp_path):
    """A worker killed mid-run (as the kernel's out-of-memory killer would) ends the command
    with one line that says what happened, and the output file is not written."""
    prepared, checkpoint = model
    source, out = tmp_path / "in.en", tmp_path / "out.de"
    source.write_text((prepared.parent / "raw" / "test.en").read_text(encoding="utf-8") * 500, encoding="utf-8")
    returncode, stderr = run_killing_a_worker("convs2s-translate", "--path", checkpoint, "--data", prepared,
                                              "-i", source, "-o", out, "--workers", 2, "--batch-size", 8)
    assert returncode == 1, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("convs2s-translate: error: a worker process died"), stderr
    assert not out.exists() and sorted(tmp_path.iterdir()) == [source]

