"""Vocabulary selection end to end on Multi30k en-de, through fairseq's own commands.

A word-level model (2000 words a side) is trained with ``--vocab-selection`` on candidates
that ``convs2s-align-dict --candidates`` built from the training text, then translates with
fairseq-generate and fairseq-interactive, with unknown-word replacement, n-best lists,
alignments and an ensemble. Trained once per module; slow (minutes), so `make test-slow` runs
it; test_vocabulary_selection.py covers the rule, the mapping, the loss and generation fast.
"""
import re

import pytest
from fairseq import options
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.tasks import setup_task

from cli_helpers import run, valid_losses
from test_unk_replacement_cli import has_aligner
from tiny_runs import USER_DIR, word_level

pytestmark = pytest.mark.slow
TEST_LINES = 101
LINES = {"train": ("train", 3000), "valid": ("val", 200), "test": ("test_2016_flickr", TEST_LINES)}
SELECTION = ["--vocab-most-common", 100, "--vocab-top-aligned", 20]


@pytest.fixture(scope="module")
def model(tmp_path_factory, data_dir):
    """(data, checkpoints folder, align.dict, candidates file, training log)."""
    if not has_aligner():
        pytest.skip("convs2s-align-dict needs fast_align or eflomal (pip install eflomal)")
    work = tmp_path_factory.mktemp("selection")
    prepared = word_level(data_dir, work, LINES, 2000)
    data = prepared / "bin"
    align_dict, candidates = work / "align.dict", work / "candidates"
    run("convs2s-align-dict", "--src", prepared / "tok" / "train.clean.en", "--tgt", prepared / "tok" / "train.clean.de",
        "-o", align_dict, "--candidates", candidates)
    checkpoints = work / "checkpoints"
    log = run("fairseq-train", data, "--user-dir", USER_DIR, "--task", "convs2s_translation",
              "--vocab-selection", candidates, *SELECTION, "--arch", "convs2s_tiny",
              "--criterion", "convs2s_cross_entropy", "--label-smoothing", 0.1, "--optimizer", "nag",
              "--lr", 0.25, "--clip-norm", 0.1, "--max-tokens", 2000, "--max-epoch", 3, "--seed", 1,
              "--num-workers", 0, "--save-dir", checkpoints, "--no-progress-bar", "--log-format", "simple")
    return data, checkpoints, align_dict, candidates, log


def fairseq(model, command, *args, checkpoint="checkpoint_best.pt", check=True, stdin=None):
    data, checkpoints, *_ = model
    return run(command, data, "--user-dir", USER_DIR, "--task", "convs2s_translation",
               "--path", checkpoint if ":" in checkpoint else checkpoints / checkpoint,
               "--beam", 5, "--batch-size", 32, *args, check=check, input=stdin)


def hypotheses(output):
    return re.findall(r"^H-(\d+)\t\S+\t(.*)$", output, flags=re.M)


def scores(output):
    """Each hypothesis's score and positional scores, in the order printed."""
    lines = re.findall(r"^H-\d+\t(\S+)\t.*$|^P-\d+\t(.*)$", output, flags=re.M)
    return [float(x) for line in lines for x in " ".join(line).split()]


def test_training_with_selection_lowers_the_loss_over_smaller_batches_of_words(model):
    data, _, _, candidates, log = model
    losses = valid_losses(log)
    assert len(losses) == 3 and losses[2] < losses[0] - 0.5, log[-3000:]
    args = options.parse_args_and_arch(options.get_training_parser(), [
        str(data), "--user-dir", str(USER_DIR), "--task", "convs2s_translation", "--arch", "convs2s_tiny",
        "--vocab-selection", str(candidates), *map(str, SELECTION)])
    task = setup_task(convert_namespace_to_omegaconf(args).task)
    task.load_dataset("train")
    itr = task.get_batch_iterator(task.dataset("train"), max_tokens=2000).next_epoch_itr(shuffle=False)
    sizes = []
    for sample in itr:
        selected = task.vocabulary_selection.with_candidates(sample, training=True)["candidates"]
        assert set(sample["target"].unique().tolist()) <= set(selected.tolist())
        sizes.append(selected.numel())
    assert max(sizes) < len(task.target_dictionary)  # a real selection, batch by batch
    assert len(set(sizes)) > 1


def test_every_word_a_candidate_gives_the_full_vocabulary_translations(model):
    full = fairseq(model, "fairseq-generate", "--nbest", 2)
    every_word = fairseq(model, "fairseq-generate", "--nbest", 2, "--vocab-selection", model[3],
                         "--vocab-most-common", 10 ** 6)
    assert len(hypotheses(full)) == 2 * TEST_LINES
    assert hypotheses(every_word) == hypotheses(full)
    # the scores up to rounding: each sentence's candidates are scored by other matrix
    # multiplies (OutputProjection.forward); the positional scores are printed with 4
    # decimals, which a last bit can flip
    assert len(scores(full)) > 2 * TEST_LINES
    assert scores(every_word) == pytest.approx(scores(full), abs=1.5e-4)


def test_generate_and_interactive_with_selection_and_unknown_word_replacement(model):
    _, _, align_dict, candidates, _ = model
    selection = ["--vocab-selection", candidates, *SELECTION, "--replace-unk", align_dict]
    generated = fairseq(model, "fairseq-generate", *selection, "--dataset-impl", "raw", "--nbest", 2,
                        "--print-alignment")
    hyps = hypotheses(generated)
    assert len(hyps) == 2 * TEST_LINES and sorted({int(i) for i, _ in hyps}) == list(range(TEST_LINES))
    assert all("<unk>" not in h for _, h in hyps)
    assert len(re.findall(r"^A-\d+\t", generated, flags=re.M)) == 2 * TEST_LINES
    plain = fairseq(model, "fairseq-generate", "--vocab-selection", candidates, *SELECTION)
    assert sum(h.split().count("<unk>") for _, h in hypotheses(plain)) > 10  # there was something to replace
    sources = re.findall(r"^S-\d+\t(.*)$", generated, flags=re.M)[:20]
    interactive = fairseq(model, "fairseq-interactive", *selection, "--buffer-size", 16, "--batch-size", 8,
                          stdin="\n".join(sources) + "\n")
    hyps = hypotheses(interactive)
    assert len(hyps) == 20 and all("<unk>" not in h for _, h in hyps)


def test_an_ensemble_translates_with_each_sentence_s_candidates(model):
    _, checkpoints, _, candidates, _ = model
    ensemble = f"{checkpoints / 'checkpoint2.pt'}:{checkpoints / 'checkpoint3.pt'}"
    output = fairseq(model, "fairseq-generate", "--vocab-selection", candidates, *SELECTION, checkpoint=ensemble)
    assert len(hypotheses(output)) == TEST_LINES


def test_bad_candidates_and_other_searches_are_errors(model, tmp_path):
    _, _, _, candidates, _ = model
    lines = candidates.read_text(encoding="utf-8").splitlines()
    bad = tmp_path / "candidates"
    bad.write_text("\n".join(lines[:2] + [lines[2] + " 7"] + lines[3:]) + "\n", encoding="utf-8")
    failed = fairseq(model, "fairseq-generate", "--vocab-selection", bad, check=False)
    assert failed.returncode != 0
    assert re.search(rf"fairseq-generate: error: {re.escape(str(bad))} line 3: expected 'source target1 count1",
                     failed.stdout), failed.stdout[-3000:]
    assert "Traceback" not in failed.stdout
    sampling = fairseq(model, "fairseq-generate", "--vocab-selection", candidates, "--sampling", "--nbest", 5,
                       check=False)
    assert sampling.returncode != 0 and "--vocab-selection works with beam search only" in sampling.stdout
