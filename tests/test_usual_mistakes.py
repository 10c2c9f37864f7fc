"""The mistakes users make first with fairseq's commands and the plugin (issues 51 and 52),
each ending in one line ``PROGRAM: error: PATH: what is wrong; what to do``, not a traceback:
a data folder that is missing, or that is convs2s-prepare's folder instead of its bin/; a
split with a binarized file missing (refused by the plugin's task before training starts); a
test sentence longer than the model takes; a folder given as --path or --input; a missing
--input; input that is not UTF-8 (fairseq-interactive warns of it read from stdin, and
convs2s-score names the line of a reference); an empty hypothesis file; a mistyped --arch or
--task ("did you mean"). Real commands on 300 lines of Multi30k and a model trained for 2
updates."""
import os
import shutil
import subprocess

import pytest

from conftest import BIN
from tiny_runs import USER_DIR

TASK = ["--task", "convs2s_translation"]
TRAIN = ["--arch", "convs2s_tiny", "--criterion", "convs2s_cross_entropy", "--optimizer", "nag", "--lr", "0.25",
         "--momentum", "0.99", "--clip-norm", "0.1", "--max-tokens", "1000", "--max-update", "2",
         "--num-workers", "0", "--no-progress-bar", "--no-epoch-checkpoints"]


def fairseq(tool, *args, input="a dog runs .\n", cwd=None):
    """fairseq's ``tool`` with the plugin: (exit status, stdout and stderr together)."""
    proc = subprocess.run([str(BIN / tool), *map(str, args), "--user-dir", USER_DIR], cwd=cwd, input=input,
                          text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
    return proc.returncode, proc.stdout


def error_line(tool, status, output):
    """The one error line of a failed command, after ``TOOL: error: ``."""
    errors = [line for line in output.splitlines() if line.startswith(f"{tool}: error: ")]
    assert status == 1 and len(errors) == 1, output[-3000:]  # not an abort after the line (SIGABRT)
    assert "Traceback" not in output, output[-3000:]
    return errors[0][len(f"{tool}: error: "):]


@pytest.fixture(scope="module")
def checkpoint(small_bin, tmp_path_factory):
    save_dir = tmp_path_factory.mktemp("tiny")
    status, output = fairseq("fairseq-train", small_bin, *TASK, *TRAIN, "--save-dir", save_dir)
    assert status == 0, output[-3000:]
    return save_dir / "checkpoint_best.pt"


def without(small_bin, tmp_path, *names):
    """A copy of the binarized folder without the files ``names``."""
    data = tmp_path / "bin"
    shutil.copytree(small_bin, data)
    for name in names:
        (data / name).unlink()
    return data


REBINARIZE = "binarize the split again (convs2s-prepare or fairseq-preprocess)"


def missing_files():
    """Each file removed with each task; the default run takes one task for each file and
    both tasks across them (each case trains: ``slow`` ones run with ``make test-slow``)."""
    removed = {"target idx": ["train.en-de.de.idx"], "target": ["train.en-de.de.idx", "train.en-de.de.bin"],
               "source idx": ["train.en-de.en.idx"]}
    tasks = {"convs2s_translation": TASK, "fairseq's task": []}
    default = {("target idx", "convs2s_translation"), ("target", "fairseq's task"), ("source idx", "fairseq's task")}
    return [pytest.param(tasks[t], removed[r], id=f"{r}-{t}", marks=[pytest.mark.slow] if (r, t) not in default else [])
            for r in removed for t in tasks]


@pytest.mark.parametrize("task, removed", missing_files())
def test_a_split_with_a_file_missing_is_named(small_bin, tmp_path, task, removed):
    """fairseq trains on the sources alone and stops at the model's TypeError (a target file
    missing), or stops with "Dataset not found" (a source file): the plugin's task refuses the
    split before training, fairseq's own task is reported in one line where it stops."""
    data = without(small_bin, tmp_path, *removed)
    status, output = fairseq("fairseq-train", data, *task, *TRAIN, "--save-dir", tmp_path / "save")
    also = f" (and {removed[1]})" if removed[1:] else ""
    assert error_line("fairseq-train", status, output) == (
        f"{data}/{removed[0]}: missing{also}: split 'train' needs the files of both sides, en and de; {REBINARIZE}")
    if task:
        assert not list(tmp_path.glob("save/*.pt")), "trained before the split was refused"
    assert not (tmp_path / "save" / ".convs2s.lock").exists(), "the exit handlers did not run"


def test_generate_translates_a_split_without_its_target_side(small_bin, checkpoint, tmp_path):
    """As fairseq does (translating monolingual text for back-translation): no references needed."""
    data = without(small_bin, tmp_path, "test.en-de.de.idx", "test.en-de.de.bin")
    status, output = fairseq("fairseq-generate", data, *TASK, "--path", checkpoint, "--beam", 2)
    assert status == 0, output[-3000:]
    assert output.count("\nH-") == 10


def test_a_split_that_is_not_there_is_named(small_bin, checkpoint):
    status, output = fairseq("fairseq-generate", small_bin, *TASK, "--path", checkpoint, "--gen-subset", "tset")
    assert error_line("fairseq-generate", status, output) == (
        f"{small_bin}: no split 'tset' for en-de (no tset.en-de.en.idx); the folder holds the splits test, train, "
        f"valid: check the split's name (--train-subset, --valid-subset, --gen-subset) and -s/-t, or {REBINARIZE}")


@pytest.fixture(scope="module")
def long_test_bin(small_bin, tmp_path_factory):
    """small_bin's test split with line 4 replaced by 1500 words (the model takes 1024 tokens)."""
    work = tmp_path_factory.mktemp("long")
    raw = small_bin.parent
    lines = (raw / "test.en").read_text(encoding="utf-8").splitlines()
    lines[3] = " ".join(["dog"] * 1500)
    (work / "test.en").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    shutil.copy(raw / "test.de", work / "test.de")
    proc = subprocess.run([str(BIN / "fairseq-preprocess"), "-s", "en", "-t", "de", "--testpref", work / "test",
                           "--destdir", work / "bin", "--srcdict", small_bin / "dict.en.txt", "--joined-dictionary"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return work / "bin"


@pytest.mark.parametrize("task", [TASK, []], ids=["convs2s_translation", "fairseq's task"])
def test_generate_refuses_a_test_sentence_longer_than_the_model_takes(long_test_bin, checkpoint, task):
    """Refused, not skipped: a score over the other sentences would not be the test set's."""
    status, output = fairseq("fairseq-generate", long_test_bin, *task, "--path", checkpoint, "--beam", 2)
    assert error_line("fairseq-generate", status, output) == (
        f"{long_test_bin}/test.en-de.en.bin: sentence 4 is 1501 tokens long, more than the model takes (1024): "
        f"remove line 4 from both sides of the split's text and binarize it again, or pass "
        f"--skip-invalid-size-inputs-valid-test to leave such sentences out (a score over the others is not the "
        f"split's)")
    if task:  # fairseq's own task drops the last batch of 1 (see the plugin's get_batch_iterator)
        status, output = fairseq("fairseq-generate", long_test_bin, *task, "--path", checkpoint, "--beam", 2,
                                 "--skip-invalid-size-inputs-valid-test")
        assert status == 0 and output.count("\nH-") == 9, output[-3000:]


FOLDER_FIX = "pass the folder of the binarized data (convs2s-prepare -o OUT writes it in OUT/bin, fairseq-preprocess " \
             "in its --destdir)"


@pytest.mark.parametrize("tool", ["fairseq-train", "fairseq-generate", "fairseq-interactive"])
def test_a_missing_data_folder_is_one_line(checkpoint, tmp_path, tool):
    options = TRAIN + ["--save-dir", tmp_path / "save"] if tool == "fairseq-train" else ["--path", checkpoint]
    status, output = fairseq(tool, "nosuch/bin", *TASK, *options, cwd=tmp_path)
    assert error_line(tool, status, output) == f"nosuch/bin: no such folder: {FOLDER_FIX}"


def test_a_file_for_the_data_folder_is_one_line(small_bin, checkpoint):
    status, output = fairseq("fairseq-generate", small_bin / "dict.en.txt", *TASK, "--path", checkpoint)
    assert error_line("fairseq-generate", status, output) == (
        f"{small_bin}/dict.en.txt: a file, not a folder: {FOLDER_FIX}")


@pytest.mark.parametrize("languages", [[], ["-s", "en", "-t", "de"]], ids=["inferred", "-s -t"])
def test_the_prepared_folder_for_its_bin_says_pass_bin(small_bin, tmp_path, languages):
    """convs2s-prepare -o data writes data/bin: passing data is the usual slip."""
    shutil.copytree(small_bin, tmp_path / "data" / "bin")
    status, output = fairseq("fairseq-train", "data", *TASK, *TRAIN, *languages, "--save-dir", "save", cwd=tmp_path)
    assert error_line("fairseq-train", status, output) == (
        "data: the binarized data is in data/bin (where convs2s-prepare writes it): pass data/bin")


@pytest.mark.parametrize("tool", ["fairseq-generate", "fairseq-interactive"])
def test_a_folder_as_path_says_which_file_to_pass(small_bin, checkpoint, tool):
    """The hub takes the checkpoints' folder, so users try it with the commands."""
    folder = checkpoint.parent
    status, output = fairseq(tool, small_bin, *TASK, "--path", folder)
    assert error_line(tool, status, output) == (
        f"{folder}: a folder, not a checkpoint: --path takes a file, e.g. {folder}/checkpoint_best.pt "
        f"(it holds checkpoint_best.pt, checkpoint_last.pt)")


@pytest.mark.parametrize("given, line", [
    ("missing.txt", "missing.txt: no such file (--input: a file of sentences, one a line; leave it out to read stdin)"),
    (".", ".: a folder, not a file: --input takes a file of sentences, one a line (or - for stdin)"),
], ids=["missing", "a folder"])
def test_interactive_s_input_that_cannot_be_read_is_one_line(small_bin, checkpoint, tmp_path, given, line):
    status, output = fairseq("fairseq-interactive", small_bin, *TASK, "--path", checkpoint, "--input", given,
                             cwd=tmp_path)
    assert error_line("fairseq-interactive", status, output) == line


def score(*args, input=""):
    proc = subprocess.run([str(BIN / "convs2s-score"), *map(str, args)], input=input.encode(), capture_output=True,
                          timeout=300)
    return proc.returncode, proc.stderr.decode()


def test_convs2s_score_names_a_reference_that_is_not_utf8(tmp_path):
    (tmp_path / "ref.de").write_bytes("Zwei Hunde.\nEin Mädchen.\n".encode("latin-1"))
    (tmp_path / "hyp.de").write_text("Zwei Hunde.\nEin Mädchen.\n", encoding="utf-8")
    status, stderr = score("-r", tmp_path / "ref.de", "-s", tmp_path / "hyp.de")
    assert error_line("convs2s-score", status, stderr) == (
        f"{tmp_path}/ref.de: line 2 is not UTF-8 (invalid continuation byte at byte 5 of the line: b'\\xe4dch'): "
        f"convert the file, e.g. iconv -f ISO-8859-1 -t UTF-8 (with its real encoding)")


@pytest.mark.parametrize("given", ["file", "stdin"])
def test_convs2s_score_says_the_hypotheses_are_empty(tmp_path, given):
    (tmp_path / "ref.de").write_text("Zwei Hunde.\n", encoding="utf-8")
    (tmp_path / "hyp.de").write_bytes(b"")
    status, stderr = score("-r", tmp_path / "ref.de", *(["-s", tmp_path / "hyp.de"] if given == "file" else []))
    name = f"{tmp_path}/hyp.de" if given == "file" else "stdin"
    assert error_line("convs2s-score", status, stderr) == (
        f"{name}: empty, no translations: did the generation fail? (see its log)")


def test_convs2s_score_names_a_missing_file(tmp_path):
    status, stderr = score("-r", tmp_path / "ref.de", input="Zwei Hunde.\n")
    assert error_line("convs2s-score", status, stderr) == f"{tmp_path}/ref.de: No such file or directory"


def test_interactive_warns_of_input_that_is_not_utf8(small_bin, checkpoint, tmp_path):
    """Read from stdin, Latin-1 bytes become <unk>s; the count is said once, as the command ends.
    Where stdin is decoded strictly, and from a file (--input), the command stops in one line."""
    latin = "Ein Mädchen läuft .\na dog runs .\nZwei Hunde im Büro .\n".encode("latin-1")
    proc = subprocess.run([str(BIN / "fairseq-interactive"), small_bin, "--user-dir", USER_DIR, *TASK, "--path",
                           checkpoint], input=latin, capture_output=True, timeout=300)
    stderr = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == 0 and proc.stdout.decode().count("\nH-") == 3, stderr[-3000:]
    warnings = [line for line in stderr.splitlines() if line.startswith("fairseq-interactive: warning:")]
    assert warnings == ["fairseq-interactive: warning: 2 input lines were not UTF-8 (the first: line 1, byte 0xe4): "
                        "their words outside UTF-8 were read as <unk>; give UTF-8 input, e.g. convert it with iconv "
                        "-f ISO-8859-1 -t UTF-8 (from its real encoding)"]
    proc = subprocess.run([str(BIN / "fairseq-interactive"), small_bin, "--user-dir", USER_DIR, *TASK, "--path",
                           checkpoint], input=latin, capture_output=True, timeout=300,
                          env=dict(os.environ, PYTHONIOENCODING="utf-8:strict"))  # as some locales decode stdin
    assert error_line("fairseq-interactive", proc.returncode, proc.stderr.decode()) == (
        "stdin: not UTF-8 (byte 0xe4): give UTF-8 input, e.g. convert it with iconv -f ISO-8859-1 -t UTF-8 (from its "
        "real encoding)")
    (tmp_path / "latin.txt").write_bytes(latin)
    status, output = fairseq("fairseq-interactive", small_bin, *TASK, "--path", checkpoint, "--input", "latin.txt",
                             cwd=tmp_path)
    assert error_line("fairseq-interactive", status, output) == (
        "latin.txt: line 1 is not UTF-8 (byte 0xe4 at byte 5 of the line): convert the file to UTF-8, e.g. iconv -f "
        "ISO-8859-1 -t UTF-8 (with its real encoding)")


@pytest.mark.parametrize("tool, options, line", [
    ("fairseq-train", ["--arch", "convs2s_iwslt_en_de"], "argument --arch/-a: invalid choice: 'convs2s_iwslt_en_de'; "
     "did you mean convs2s_iwslt_de_en (or convs2s_wmt_en_de, convs2s_wmt_en_ro)?"),
    ("fairseq-generate", ["--task", "convs2s_translaton"], "argument --task: invalid choice: 'convs2s_translaton'; "
     "did you mean convs2s_translation (or translation, online_backtranslation)?"),
], ids=["--arch", "--task"])
def test_a_mistyped_arch_or_task_gets_did_you_mean(small_bin, tmp_path, tool, options, line):
    """fairseq's error line with the closest registered names, not its whole usage and the
    list of every architecture it has."""
    status, output = fairseq(tool, small_bin, *options, cwd=tmp_path)
    assert status == 2 and error_line(tool, 1, output) == line
    assert "usage:" not in output and "choose from" not in output


def test_a_folder_as_the_candidates_file_is_called_a_folder(tmp_path):
    """Not "no such file": the folder is there, and a file in it was meant."""
    from fairseq_convs2s_ext.data import CandidatesFileError, VocabularySelection
    from model_helpers import dictionary

    with pytest.raises(CandidatesFileError) as raised:
        VocabularySelection.from_file(str(tmp_path), dictionary(), dictionary(), most_common=2, top_aligned=2)
    assert str(raised.value) == (f"{tmp_path}: a folder, not a file; write it with convs2s-align-dict --candidates "
                                 f"{tmp_path} on the training text")
