"""The lean beam step finds exactly what fairseq's SequenceGenerator finds.

A word-level ConvS2S trained briefly on Multi30k en-de translates real test sentences with
stock fairseq (``--task translation``, or the parent task's generator) and with
``--task convs2s_translation``, whose generator offers the search only each hypothesis's
2 x beam best words: the same hypotheses, scores, positional scores, attention, alignments
and n-best lists, bit for bit.
"""
import re

import pytest
import torch
from fairseq import checkpoint_utils
from fairseq.sequence_generator import SequenceGenerator
from fairseq.tasks.translation import TranslationTask

from convs2s_serving import top_log_probs
from fairseq_convs2s_ext.generation import LeanSequenceGenerator, LeanSequenceGeneratorWithAlignment
from fairseq_convs2s_ext.generation.lean_beam_step import LocalVocabularyEnsemble
from fairseq_convs2s_ext.generation import UnknownWordReplacer
from cli_helpers import run
from tiny_runs import USER_DIR, prepared_for_generation, train_paper, word_level

TEST_LINES = 101
LINES = {"train": ("train", 3000), "valid": ("val", 200), "test": ("test_2016_flickr", TEST_LINES)}


@pytest.fixture(scope="module")
def model(tmp_path_factory, data_dir):
    """(binarized data with its text, checkpoint): 2000 words a side, so that it writes <unk>."""
    work = tmp_path_factory.mktemp("lean")
    data = word_level(data_dir, work, LINES, 2000) / "bin"
    return data, train_paper(data, work / "checkpoints", "--max-epoch", 3, "--max-tokens", 2000)


def setup(model, *generation_options):
    data, checkpoint = model
    return prepared_for_generation(data, checkpoint, *generation_options)


def stock_generator(task, models, gen_cfg):
    """fairseq's own generator for these options (the parent task's build_generator)."""
    return TranslationTask.build_generator(task, models, gen_cfg)


def widths(generator):
    """Record the width of the log-probabilities the lean ensemble hands the search."""
    ensemble = generator.model
    recorded, forward = [], ensemble.forward_decoder

    def recording(*args, **kwargs):
        lprobs, attn = forward(*args, **kwargs)
        recorded.append(lprobs.size(1))
        return lprobs, attn

    ensemble.forward_decoder = recording
    return recorded


def kernel_calls(monkeypatch):
    """Record, for each step, whether the top_log_probs kernel computed it."""
    recorded, kernel = [], top_log_probs.log_softmax_top_k

    def recording(*args):
        result = kernel(*args)
        recorded.append(result is not None)
        return result

    monkeypatch.setattr(top_log_probs, "log_softmax_top_k", recording)
    return recorded


def translate(task, generator, models, batches, **kwargs):
    return [hypo for sample in batches for hypo in task.inference_step(generator, models, sample, **kwargs)]


def assert_identical(stock, lean):
    assert len(stock) == len(lean)
    for stock_nbest, lean_nbest in zip(stock, lean):
        assert len(stock_nbest) == len(lean_nbest)
        for a, b in zip(stock_nbest, lean_nbest):
            assert torch.equal(a["tokens"], b["tokens"])
            assert a["score"].item() == b["score"].item()
            assert torch.equal(a["positional_scores"], b["positional_scores"])
            assert torch.equal(a["attention"], b["attention"])
            assert a["alignment"] == b["alignment"] if isinstance(a["alignment"], list) \
                else torch.equal(a["alignment"], b["alignment"])  # pairs with --print-alignment


@pytest.mark.parametrize("generation_options", [
    ["--beam", 1],
    ["--beam", 5],
    ["--beam", 5, "--nbest", 5],
    ["--beam", 4, "--nbest", 2, "--print-alignment", "--lenpen", 0.6, "--unkpen", 0.5, "--min-len", 3],
])
def test_lean_step_finds_stock_hypotheses_and_scores(model, generation_options, monkeypatch):
    task, models, batches, gen_cfg = setup(model, *generation_options)
    lean = task.build_generator(models, gen_cfg)
    alignment = "--print-alignment" in generation_options
    assert type(lean) is (LeanSequenceGeneratorWithAlignment if alignment else LeanSequenceGenerator)
    assert lean.lean
    recorded, kernel = widths(lean), kernel_calls(monkeypatch)
    lean_hypos = translate(task, lean, models, batches)
    assert set(recorded) == {task.target_dictionary.nspecial + 2 * gen_cfg.beam}  # specials + 2 x beam
    assert set(kernel) == {top_log_probs.load() is not None}  # where it is built, every step
    stock_hypos = translate(task, stock_generator(task, models, gen_cfg), models, batches)
    assert_identical(stock_hypos, lean_hypos)
    assert len(lean_hypos) == TEST_LINES and all(len(n) == gen_cfg.beam for n in lean_hypos)  # n-best: all
    if alignment:
        assert all(len(h["alignment"]) > 0 for n in lean_hypos for h in n)


def test_lean_step_without_the_kernel_finds_stock_hypotheses_and_scores(model, monkeypatch):
    """As on a CPU where the top_log_probs kernel cannot be had: torch's operations."""
    monkeypatch.setattr(top_log_probs, "load", lambda: None)
    task, models, batches, gen_cfg = setup(model, "--beam", 5, "--nbest", 2)
    lean = task.build_generator(models, gen_cfg)
    kernel = kernel_calls(monkeypatch)
    lean_hypos = translate(task, lean, models, batches)
    assert kernel and not any(kernel)
    assert_identical(translate(task, stock_generator(task, models, gen_cfg), models, batches), lean_hypos)


def test_lean_step_with_an_ensemble_averages_as_fairseq(model):
    """Two different models: fairseq averages their probabilities; so does the lean step."""
    task, models, batches, gen_cfg = setup(model, "--beam", 5, "--nbest", 2, "--print-alignment")
    batches = batches[:2]
    other, _ = checkpoint_utils.load_model_ensemble([str(model[1])], task=task)
    with torch.no_grad():
        for p in other[0].parameters():
            p.add_(0.05 * torch.randn_like(p))
    ensemble = [models[0], other[0]]
    lean = task.build_generator(ensemble, gen_cfg)
    assert isinstance(lean.model, LocalVocabularyEnsemble) and lean.model.models_size == 2
    recorded = widths(lean)
    lean_hypos = translate(task, lean, ensemble, batches)
    assert recorded and set(recorded) == {task.target_dictionary.nspecial + 10}
    assert_identical(translate(task, stock_generator(task, ensemble, gen_cfg), ensemble, batches), lean_hypos)


def test_lean_step_with_unknown_word_replacement(model):
    """--replace-unk wraps the lean generator: the same replaced hypotheses as with fairseq's."""
    task, models, batches, gen_cfg = setup(model, "--beam", 5, "--replace-unk")
    lean = task.build_generator(models, gen_cfg)
    assert isinstance(lean, UnknownWordReplacer) and isinstance(lean.generator, LeanSequenceGenerator)
    stock = UnknownWordReplacer(stock_generator(task, models, gen_cfg), task.source_dictionary,
                                task.target_dictionary, {})
    plain = translate(task, stock.generator, models, batches)
    assert sum(h[0]["tokens"].eq(task.target_dictionary.unk()).sum().item() for h in plain) > 10
    assert_identical(translate(task, stock, models, batches), translate(task, lean, models, batches))


def test_prefix_tokens_fall_back_to_the_stock_step(model):
    """Forced prefixes index the full vocabulary: such a call is fairseq's own search."""
    task, models, batches, gen_cfg = setup(model, "--beam", 5)
    batches = batches[:2]
    lean = task.build_generator(models, gen_cfg)
    recorded = widths(lean)
    prefixes = [sample["target"][:, :2] for sample in batches]
    stock = stock_generator(task, models, gen_cfg)
    for sample, prefix in zip(batches, prefixes):
        assert_identical(task.inference_step(stock, models, sample, prefix_tokens=prefix),
                         task.inference_step(lean, models, sample, prefix_tokens=prefix))
    assert recorded == []
    assert lean.full_vocabulary.vocab_size == len(task.target_dictionary)


@pytest.mark.parametrize("generation_options", [
    ["--sampling", "--beam", 5, "--nbest", 5],
    ["--diverse-beam-groups", 5, "--beam", 5],
    ["--diversity-rate", 0.5],
    ["--match-source-len"],
    ["--no-repeat-ngram-size", 2],
])
def test_other_searches_keep_fairseq_step(model, generation_options):
    task, models, batches, gen_cfg = setup(model, *generation_options)
    generator = task.build_generator(models, gen_cfg)
    assert not generator.lean


def test_the_beam_step_is_the_one_measured_faster_on_the_device_unless_chosen(model):
    """On a CPU the lean step (bench/README.md); ``--beam-step stock`` gives fairseq's
    generator, with the same hypotheses; the lean step itself is tested above."""
    task, models, batches, gen_cfg = setup(model, "--beam", 5)
    assert task.beam_step(models) == "lean"
    lean = task.build_generator(models, gen_cfg)
    assert type(lean) is LeanSequenceGenerator
    stock_task, _, _, _ = setup(model, "--beam", 5, "--beam-step", "stock")
    stock = stock_task.build_generator(models, gen_cfg)
    assert type(stock) is SequenceGenerator
    assert_identical(translate(task, stock, models, batches[:2]), translate(task, lean, models, batches[:2]))


def fairseq_generate(model, task, *args):
    data, checkpoint = model
    output = run("fairseq-generate", data, "--user-dir", USER_DIR, "--task", task, "--path", checkpoint,
                 "--gen-subset", "test", "--batch-size", 32, "--required-batch-size-multiple", 1, *args)
    return re.findall(r"^[HPA]-\d+\t.*$", output, flags=re.M)


@pytest.mark.parametrize("generation_options", [
    pytest.param(["--beam", 1], marks=pytest.mark.slow),
    ["--beam", 5, "--nbest", 3, "--print-alignment"],
])
def test_fairseq_generate_prints_the_same_translations_as_stock_fairseq(model, generation_options):
    stock = fairseq_generate(model, "translation", *generation_options)
    lean = fairseq_generate(model, "convs2s_translation", *generation_options)
    nbest = generation_options[generation_options.index("--nbest") + 1] if "--nbest" in generation_options else 1
    assert len([line for line in lean if line.startswith("H-")]) == TEST_LINES * nbest
    assert lean == stock
