"""Inputs a careless user or an attacker gives fairseq's commands, with the plugin loaded:
a checkpoint with other dictionaries, an over-long or empty input line, a malformed
--replace-unk file, a vocabulary selection file or option that cannot be. Each gets a clear
answer instead of garbage or a traceback."""
import pytest

from cli_helpers import PAPER_OPTIONS, hypotheses, run
from conftest import ROOT

USER_DIR = ROOT / "fairseq_convs2s_ext"
TASK = ["--user-dir", USER_DIR, "--task", "convs2s_translation"]


@pytest.fixture(scope="module")
def checkpoint(small_bin, tmp_path_factory):
    save_dir = tmp_path_factory.mktemp("tiny")
    run("fairseq-train", small_bin, *TASK, "--arch", "convs2s_tiny", "--criterion", "convs2s_cross_entropy",
        *PAPER_OPTIONS, "--max-tokens", "1000", "--max-epoch", "1", "--save-dir", save_dir,
        "--no-epoch-checkpoints", "--num-workers", "0", "--no-progress-bar")
    return save_dir / "checkpoint_last.pt"


@pytest.fixture(scope="module")
def swapped_bin(small_bin, tmp_path_factory):
    """The same test text binarized with a dictionary of the same size, two words swapped."""
    work = tmp_path_factory.mktemp("swapped")
    lines = (small_bin / "dict.en.txt").read_text(encoding="utf-8").splitlines()
    lines[10], lines[11] = lines[11], lines[10]
    (work / "dict.txt").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    raw = small_bin.parent
    run("fairseq-preprocess", "-s", "en", "-t", "de", "--testpref", raw / "test", "--destdir", work / "bin",
        "--srcdict", work / "dict.txt", "--joined-dictionary")
    return work / "bin"


@pytest.mark.parametrize("task", [TASK, ["--user-dir", USER_DIR]])
def test_generation_refuses_a_checkpoint_with_other_dictionaries(swapped_bin, checkpoint, task):
    output = run("fairseq-generate", swapped_bin, *task, "--path", checkpoint, "--gen-subset", "test",
                 check=False)
    assert output.returncode != 0 and not hypotheses(output.stdout)
    error = [line for line in output.stdout.splitlines() if line.startswith("fairseq-generate: error:")]
    assert len(error) == 1 and "trained with another source dictionary" in error[0], output.stdout[-3000:]
    if task == TASK:  # the task knows which file the dictionary came from
        assert str(swapped_bin / "dict.en.txt") in error[0]
    assert "Traceback" not in output.stdout


def test_interactive_and_python_refuse_it(swapped_bin, checkpoint):
    from fairseq_convs2s_ext.checkpoints import DictionaryMismatch
    from fairseq_convs2s_ext.models import ConvS2SModel

    output = run("fairseq-interactive", swapped_bin, *TASK, "--path", checkpoint, "-s", "en", "-t", "de",
                 input="a dog runs .\n", check=False)
    assert output.returncode != 0 and "trained with another source dictionary" in output.stdout
    with pytest.raises(DictionaryMismatch, match=str(swapped_bin / "dict.en.txt")):
        ConvS2SModel.from_pretrained(str(checkpoint.parent), checkpoint_file=checkpoint.name,
                                     data_name_or_path=str(swapped_bin), task="convs2s_translation")


def test_interactive_reports_an_over_long_line_and_goes_on(small_bin, checkpoint):
    """Line 2 is 2000 tokens (the model takes 1024): reported, and lines 3 and 4 still come out;
    line 3 is empty and its translation is empty."""
    lines = ["a dog runs .", " ".join(["dog"] * 2000), "", "two men are talking ."]
    output = run("fairseq-interactive", small_bin, *TASK, "--path", checkpoint, "-s", "en", "-t", "de",
                 "--beam", "2", input="".join(line + "\n" for line in lines), check=False)
    assert output.returncode == 0, output.stdout[-3000:]
    assert "input line 2 skipped: 2001 tokens, more than the model takes" in output.stdout
    hyps = hypotheses(output.stdout)
    assert sorted(hyps) == [0, 2, 3], output.stdout[-3000:]
    assert hyps[2] == "" and hyps[0] and hyps[3]


@pytest.mark.parametrize("tool", ["fairseq-generate", "fairseq-interactive"])
def test_a_malformed_replace_unk_file_names_its_line(small_bin, checkpoint, tmp_path, tool):
    bad = tmp_path / "align.dict"
    bad.write_text("Hund dog\nKatze\n", encoding="utf-8")
    args = ["--gen-subset", "test", "--dataset-impl", "raw"] if tool == "fairseq-generate" else ["-s", "en", "-t", "de"]
    output = run(tool, small_bin, *TASK, "--path", checkpoint, "--replace-unk", bad, *args,
                 input="a dog runs .\n", check=False)
    assert output.returncode != 0
    assert f"{tool}: error: {bad} line 2: 'Katze' has 1 words, not 'source target'" in output.stdout, \
        output.stdout[-3000:]
    assert "Traceback" not in output.stdout


@pytest.mark.parametrize("tool", ["fairseq-generate", "fairseq-interactive"])
@pytest.mark.parametrize("problem", ["malformed candidates", "negative clusters"])
def test_vocabulary_selection_s_bad_file_or_option_is_one_line(small_bin, checkpoint, tmp_path, tool, problem):
    candidates = tmp_path / "candidates"
    candidates.write_text("dog Hund 3 Katze\n" if problem == "malformed candidates" else "", encoding="utf-8")
    options = ["--vocab-selection", candidates]
    if problem == "negative clusters":
        options += ["--vocab-rest-clusters", "-1"]
    args = ["--gen-subset", "test"] if tool == "fairseq-generate" else ["-s", "en", "-t", "de"]
    output = run(tool, small_bin, *TASK, "--path", checkpoint, *options, *args, input="a dog runs .\n",
                 check=False)
    assert output.returncode != 0
    expected = (f"{tool}: error: {candidates} line 1: expected 'source target1 count1 target2 count2 ...'"
                if problem == "malformed candidates" else
                f"{tool}: error: --vocab-rest-clusters (-1) must not be negative: 0 for the softmax over "
                f"the candidates alone, or a number of clusters")
    assert expected in output.stdout, output.stdout[-3000:]
    assert "Traceback" not in output.stdout


@pytest.fixture(scope="module")
def hub(small_bin, checkpoint):
    from fairseq_convs2s_ext.models import ConvS2SModel

    return ConvS2SModel.from_pretrained(str(checkpoint.parent), checkpoint_file=checkpoint.name,
                                        data_name_or_path=str(small_bin), task="convs2s_translation")


@pytest.mark.parametrize("sentences, message", [
    (b"a dog runs .", "not bytes: decode it first, e.g. sentences.decode('utf-8')"),
    (["a dog runs .", None], ": sentences[1] is NoneType, not str"),
    (("a dog runs .", b"a cat"), ": sentences[1] is bytes, not str"),
    (42, "not int"),
], ids=["bytes", "None in a list", "bytes in a tuple", "int"])
@pytest.mark.parametrize("method", ["translate", "sample"])
def test_the_hub_takes_a_str_or_a_list_of_str_only(hub, sentences, message, method):
    """fairseq's hub would translate each byte of a bytes object as a sentence, and None as a word."""
    with pytest.raises(TypeError) as raised:
        getattr(hub, method)(sentences)
    separator = ", " if message.startswith("not") else ""
    assert str(raised.value) == f"translate/sample take a str or a list of str{separator}{message}"
    assert isinstance(hub.translate("a dog runs ."), str)
    assert [type(t) for t in hub.translate(["a dog runs .", ""])] == [str, str]
