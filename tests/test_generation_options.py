"""fairseq's own generation options that fail inside fairseq 0.12.3 work with
``--task convs2s_translation``, or are refused in one line
(fairseq_convs2s_ext.generation.fairseq_options): a tiny ConvS2S trained on 300 Multi30k
pairs, translated with fairseq's real commands and, where the output is compared with fairseq's
own search, in this process."""
import re
import subprocess

import pytest
import torch
from fairseq import search
from fairseq.sequence_generator import SequenceGenerator

from cli_helpers import run
from conftest import BIN, COMMAND_TIMEOUT, ROOT
from fairseq_convs2s_ext.generation.fairseq_options import SCORE_REFERENCE_INTERACTIVE
from tiny_runs import USER_DIR, prepared_for_generation, train

GENERATE = ["--user-dir", USER_DIR, "--task", "convs2s_translation", "--gen-subset", "test", "--max-len-b", 8]


@pytest.fixture(scope="module")
def checkpoint(small_bin, tmp_path_factory):
    save_dir = tmp_path_factory.mktemp("generation-options")
    train(small_bin, save_dir, "--max-update", "80")  # long enough for hypotheses of several lengths
    return save_dir / "checkpoint_best.pt"


def hypotheses(hypos):
    """Each sentence's n-best list as (tokens, score, positional scores), exact values."""
    return [[(h["tokens"].tolist(), h["score"].item(), h["positional_scores"].tolist()) for h in nbest]
            for nbest in hypos]


def test_diverse_beam_search_finds_fairseqs_hypotheses_whatever_the_sentence_ids(small_bin, checkpoint):
    """fairseq's DiverseBeamSearch is right only where a batch's sentence ids are its positions
    (0, 1, 2, ...); there, the task's generator finds its hypotheses and scores exactly, and it
    finds the same for any other ids, where fairseq's fails (IndexError) or reads another
    sentence's overlap."""
    task, models, (sample, *_), gen_cfg = prepared_for_generation(
        small_bin, checkpoint, "--beam", 4, "--diverse-beam-groups", 2, "--max-len-b", 40, max_sentences=10)
    positions = torch.arange(len(sample["id"]))
    stock = SequenceGenerator(models, task.target_dictionary, beam_size=4, max_len_b=40,
                              search_strategy=search.DiverseBeamSearch(task.target_dictionary, 2, 0.5))
    expected = hypotheses(stock.generate(models, dict(sample, id=positions)))
    lengths = [[len(tokens) for tokens, _, _ in nbest] for nbest in expected]
    assert len({max(nbest) for nbest in lengths}) > 1, f"no sentence finished before another: {lengths}"

    ours = task.build_generator(models, gen_cfg)
    for ids in (positions, positions + 7, positions.flip(0)):
        assert hypotheses(task.inference_step(ours, models, dict(sample, id=ids))) == expected, ids
    with pytest.raises(IndexError):  # fairseq's own: when this fails, fairseq was repaired
        stock.generate(models, dict(sample, id=positions + 7))


def test_diverse_beam_search_in_fairseq_generate(small_bin, checkpoint):
    """Every batch of the split, each sentence with its --nbest hypotheses."""
    out = run("fairseq-generate", small_bin, *GENERATE, "--path", checkpoint, "--beam", 4,
              "--diverse-beam-groups", 2, "--nbest", 4, "--batch-size", 3)
    ids = re.findall(r"^H-(\d+)\t", out, flags=re.M)
    assert sorted(ids) == sorted(str(i) for i in range(10) for _ in range(4)), out[-3000:]


def steps_and_hypotheses(out):
    """{sentence: (I- value, hypothesis, its positional scores)} of fairseq-generate's output."""
    found = {}
    for line in out.splitlines():
        kind, _, rest = line.partition("-")
        if kind in ("H", "P", "I") and rest.split("\t", 1)[0].isdigit():
            sentence, value = rest.split("\t", 1)
            found.setdefault(int(sentence), {})[kind] = value
    return found


@pytest.mark.parametrize("beam_step", ["lean", "stock"])
def test_print_step_prints_each_hypothesis_decoding_steps(small_bin, checkpoint, beam_step):
    """One step a token, its end of sentence included; the hypotheses and scores of fairseq's
    own step (--beam-step stock), with the lean step too."""
    printed = steps_and_hypotheses(run("fairseq-generate", small_bin, *GENERATE, "--path", checkpoint,
                                       "--beam-step", beam_step, "--print-step"))
    plain = steps_and_hypotheses(run("fairseq-generate", small_bin, *GENERATE, "--path", checkpoint,
                                     "--beam-step", "stock"))
    assert sorted(printed) == list(range(10))
    for sentence, lines in printed.items():
        assert int(lines["I"]) == len(lines["P"].split()), lines
        assert (lines["H"], lines["P"]) == (plain[sentence]["H"], plain[sentence]["P"])


def test_print_step_with_score_reference_counts_the_reference_tokens(small_bin, checkpoint):
    printed = steps_and_hypotheses(run("fairseq-generate", small_bin, *GENERATE, "--path", checkpoint,
                                       "--score-reference", "--print-step"))
    references = (small_bin / "test.en-de.de").read_text(encoding="utf-8").splitlines()
    assert sorted(printed) == list(range(10))
    for sentence, lines in printed.items():  # the reference's words (a few are <unk>) and its end
        assert int(lines["I"]) == len(references[sentence].split()) + 1 == len(lines["P"].split()), lines


def test_score_reference_in_fairseq_interactive_is_refused_in_one_line(small_bin, checkpoint):
    proc = subprocess.run([str(BIN / "fairseq-interactive"), str(small_bin), "--user-dir", str(USER_DIR), "--task",
                           "convs2s_translation", "--path", str(checkpoint), "--score-reference"],
                          cwd=ROOT, input="A dog runs .\n", text=True, capture_output=True,
                          timeout=COMMAND_TIMEOUT)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.splitlines()[-1] == f"fairseq-interactive: error: {SCORE_REFERENCE_INTERACTIVE}"
    assert proc.stdout == ""
