"""Unknown-word replacement end to end on Multi30k en-de, through fairseq's own commands.

A word-level model with a 1000-word vocabulary a side, trained briefly with
``--criterion convs2s_cross_entropy``, writes many ``<unk>``; ``fairseq-generate`` and
``fairseq-interactive`` with ``--task convs2s_translation --replace-unk`` must replace every
one of them by a dictionary translation or a copy of a source word. Trained once per module.
"""
import re
import shutil
import subprocess
import sys
from collections import Counter
from itertools import product
from pathlib import Path

import pytest
from fairseq import options
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.tasks import setup_task
from fairseq.utils import load_align_dict

from fairseq_convs2s_ext.data import SourceTextError
from convs2s_preprocess.stages.align import find_aligner
from convs2s_preprocess.errors import PreprocessError

from cli_helpers import run
from tiny_runs import USER_DIR, train_paper, word_level

BIN = Path(sys.executable).parent
LINES = {"train": ("train", 3000), "valid": ("val", 200), "test": ("test_2016_flickr", 203)}
TEST_LINES = LINES["test"][1]  # not a multiple of 8: fairseq would drop the last 3 (--batch-size 32)
UNK = "<unk>"


def dice_dictionary(src_path: Path, tgt_path: Path, out: Path) -> None:
    """An alignment dictionary without a word aligner: each source word's target word of
    highest Dice coefficient over sentence co-occurrence."""
    pairs, src_counts, tgt_counts = Counter(), Counter(), Counter()
    with open(src_path, encoding="utf-8") as src, open(tgt_path, encoding="utf-8") as tgt:
        for s, t in zip(src, tgt):
            s, t = set(s.split()), set(t.split())
            src_counts.update(s)
            tgt_counts.update(t)
            pairs.update(product(s, t))
    best = {}
    for (s, t), n in sorted(pairs.items()):
        score = 2 * n / (src_counts[s] + tgt_counts[t])
        if score > best.get(s, (0, None))[0]:
            best[s] = (score, t)
    out.write_text("".join(f"{s} {t}\n" for s, (_, t) in sorted(best.items())), encoding="utf-8")


def has_aligner() -> bool:
    try:
        find_aligner()
    except PreprocessError:
        return False
    return True


def align_dict(prepared: Path) -> Path:
    """convs2s-align-dict on the cleaned training text when an aligner is installed, else Dice."""
    src, tgt, out = prepared / "tok" / "train.clean.en", prepared / "tok" / "train.clean.de", prepared / "align.dict"
    if has_aligner():
        run("convs2s-align-dict", "--src", src, "--tgt", tgt, "-o", out)
    else:
        dice_dictionary(src, tgt, out)
    return out


@pytest.fixture(scope="module")
def model(tmp_path_factory, data_dir):
    """The first lines of Multi30k en-de prepared by convs2s-prepare at word level (1000 words a
    side), a tiny model trained 4 epochs with the paper's settings, the alignment dictionary."""
    work = tmp_path_factory.mktemp("unk")
    prepared = word_level(data_dir, work, LINES, 1000)
    checkpoint = train_paper(prepared / "bin", work / "checkpoints", "--max-epoch", 4, "--max-tokens", 2000)
    return prepared / "bin", checkpoint, align_dict(prepared)


def fairseq(model, command, *args, stdin=None, task=("--task", "convs2s_translation"), check=True):
    data, checkpoint, _ = model
    cmd = [*command, data, "--user-dir", USER_DIR, *task, "--path", checkpoint, "--beam", 5, *args]
    proc = subprocess.run([str(c) for c in cmd], input=stdin, capture_output=True, text=True)
    if not check:
        return proc
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def lines(output: str, kind: str) -> dict:
    """{sentence id: text} of the S-, T- or H- lines (H without its score)."""
    found = {}
    for index, text in re.findall(rf"^{kind}-(\d+)\t(.*)$", output, re.MULTILINE):
        found[int(index)] = text.split("\t", 1)[1] if kind == "H" else text
    return found


@pytest.fixture(scope="module")
def plain(model):
    return fairseq(model, [BIN / "fairseq-generate"], "--batch-size", 32)


@pytest.fixture(scope="module")
def replaced(model):
    return fairseq(model, [BIN / "fairseq-generate"], "--batch-size", 32, "--dataset-impl", "raw",
                   "--replace-unk", model[2])


def replacements(plain_hypothesis, hypothesis):
    """The words that stand where the hypothesis without replacement has <unk>."""
    before, after = plain_hypothesis.split(), hypothesis.split()
    assert len(before) == len(after)
    assert [b for b in before if b != UNK] == [a for a, b in zip(after, before) if b != UNK]
    return [a for a, b in zip(after, before) if b == UNK]


def test_generate_translates_every_sentence(plain, replaced):
    assert sorted(lines(plain, "H")) == sorted(lines(replaced, "H")) == list(range(TEST_LINES))


def test_generate_replaces_every_unknown_by_a_dictionary_translation_or_a_source_word(
        model, plain, replaced):
    align = load_align_dict(str(model[2]))
    sources, references = lines(replaced, "S"), lines(replaced, "T")
    before, after = lines(plain, "H"), lines(replaced, "H")
    assert sum(h.split().count(UNK) for h in before.values()) >= 50  # the model writes <unk>
    by_dictionary = copied = 0
    for i, hypothesis in after.items():
        assert UNK not in hypothesis
        source = sources[i].split()
        for word in replacements(before[i], hypothesis):
            assert word in {align.get(s, s) for s in source}
            by_dictionary += word in {align[s] for s in source if s in align}
            copied += word in {s for s in source if s not in align}
    assert by_dictionary > 0 and copied > 0
    # the original words are printed, not <unk>
    assert UNK not in "".join(sources.values()) + "".join(references.values())
    assert sources[0] == Path(model[0], "test.en-de.en").read_text(encoding="utf-8").splitlines()[0]


def test_bare_replace_unk_copies_source_words(model, plain):
    copied = fairseq(model, [sys.executable, "-m", "fairseq_cli.generate"],
                     "--batch-size", 32, "--dataset-impl", "raw", "--replace-unk")
    before, after, sources = lines(plain, "H"), lines(copied, "H"), lines(copied, "S")
    assert len(after) == TEST_LINES
    for i, hypothesis in after.items():
        assert all(word in sources[i].split() for word in replacements(before[i], hypothesis))


def test_interactive_replaces_unknowns_in_raw_input(model, plain, replaced):
    """Sentences read from standard input, several per batch. A twin of a sentence, whose
    copied unknown word is swapped for another unknown word, has the same token ids and
    hence the same translation, with its own word copied."""
    sources, before, after = lines(replaced, "S"), lines(plain, "H"), lines(replaced, "H")
    vocabulary = set(Path(model[0], "dict.en.txt").read_text(encoding="utf-8").split()[::2])
    align = load_align_dict(str(model[2]))
    twin_of = next(
        (i, word) for i in sorted(after)
        for word in replacements(before[i], after[i])
        if word in sources[i].split() and word not in vocabulary and word not in align
        and sources[i].split().count(word) == 1
    )
    i, word = twin_of
    twin = " ".join("Quuxbarring" if w == word else w for w in sources[i].split())
    inputs = [sources[j] for j in range(40)] + [sources[i], twin]
    output = fairseq(model, [BIN / "fairseq-interactive"], "--buffer-size", 64, "--batch-size", 8,
                     "--replace-unk", model[2], stdin="\n".join(inputs) + "\n")
    hypotheses = lines(output, "H")
    assert len(hypotheses) == len(inputs)
    assert all(UNK not in h for h in hypotheses.values())
    assert [hypotheses[j] for j in range(40)] == [after[j] for j in range(40)]  # as generate's
    assert hypotheses[41].split() == ["Quuxbarring" if w == word else w for w in hypotheses[40].split()]
    assert word in hypotheses[40].split()


def test_binarized_data_alone_is_an_error_that_says_what_to_pass(model, tmp_path):
    data = tmp_path / "bin"
    shutil.copytree(model[0], data, ignore=shutil.ignore_patterns("*.en-de.en", "*.en-de.de"))
    parser = options.get_generation_parser()
    args = options.parse_args_and_arch(parser, [str(data), "--task", "convs2s_translation",
                                                "--replace-unk", "--path", "unused.pt"])
    task = setup_task(convert_namespace_to_omegaconf(args).task)
    with pytest.raises(SourceTextError, match=re.escape("--dataset-impl raw, which reads test.en-de.en")):
        task.load_dataset("test")


@pytest.mark.parametrize("task, impl", [(("--task", "convs2s_translation"), ()), ((), ("--dataset-impl", "raw"))])
def test_stock_replace_unk_paths_say_what_to_use(model, task, impl):
    """fairseq's own assertion (no --dataset-impl raw) and its own broken replacement (stock
    task) each end in one line saying what to pass, not a traceback."""
    proc = fairseq(model, [BIN / "fairseq-generate"], "--batch-size", 32, *impl, "--replace-unk", model[2],
                   task=task, check=False)
    assert proc.returncode != 0
    assert "fairseq-generate: error: --replace-unk needs --task convs2s_translation" in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
