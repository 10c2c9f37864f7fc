"""bench.serving's systems on tiny models: CTranslate2 (float32 and int8) converting a fairseq
Transformer, fairseq's generator over it and ours in int8 all translate, and at equal work
every hypothesis of every system is the forced length."""
import argparse

import pytest

pytest.importorskip("ctranslate2", reason="bench.serving's peer: pip install ctranslate2 (a benchmark dependency)")

from bench.generation import generation_batches  # noqa: E402
from bench.models import convs2s_task, translation_task  # noqa: E402
from bench.serving import CTranslate2System, FairseqSystem, converted, detokenized  # noqa: E402
from cli_helpers import run  # noqa: E402
from fairseq import checkpoint_utils  # noqa: E402
from tiny_runs import USER_DIR, prepare, train  # noqa: E402

FORCED = 7


@pytest.fixture(scope="module")
def models(tmp_path_factory, data_dir):
    """(binarized folder, a tiny fairseq Transformer's checkpoint, a tiny ConvS2S's), a few updates each."""
    work = tmp_path_factory.mktemp("serving")
    data_bin = prepare(data_dir, work, "--bpe-merges", "500") / "bin"
    run("fairseq-train", data_bin, "--user-dir", USER_DIR, "--arch", "transformer", "--encoder-layers", 1,
        "--decoder-layers", 1, "--encoder-embed-dim", 32, "--decoder-embed-dim", 32, "--encoder-ffn-embed-dim", 64,
        "--decoder-ffn-embed-dim", 64, "--encoder-attention-heads", 2, "--decoder-attention-heads", 2,
        "--share-decoder-input-output-embed", "--optimizer", "adam", "--lr", "1e-3", "--criterion",
        "label_smoothed_cross_entropy", "--max-tokens", 1000, "--max-update", 3, "--save-dir", work / "transformer",
        "--no-epoch-checkpoints", "--num-workers", 0, "--seed", 1)
    train(data_bin, work / "convs2s", "--task", "convs2s_translation", "--max-update", "3")
    return data_bin, work / "transformer" / "checkpoint_last.pt", work / "convs2s" / "checkpoint_last.pt"


def options():
    return argparse.Namespace(beam=5, batch_size=8, threads=1)


def test_every_system_translates_every_sentence_and_forced_length_is_equal_work(models):
    data_bin, transformer, convs2s = models
    task, int8_task = translation_task(data_bin), convs2s_task(data_bin, quantize="int8")
    batches = generation_batches(task, 8)
    ids = sorted(i for batch in batches for i in batch["id"].tolist())
    lines = (data_bin / "test.en-de.en").read_text(encoding="utf-8").splitlines()
    sources = [lines[i].split() for i in ids]

    def loaded(checkpoint, model_task):
        (model,), _ = checkpoint_utils.load_model_ensemble([str(checkpoint)], task=model_task)
        return model

    systems = [
        CTranslate2System("float32", converted(transformer, data_bin, "float32"), "float32", options(), sources),
        CTranslate2System("int8", converted(transformer, data_bin, "int8"), "int8", options(), sources),
        FairseqSystem("fairseq", loaded(transformer, task), task, options(), batches),
        FairseqSystem("ours int8", loaded(convs2s, int8_task), int8_task, options(), batches),
    ]
    assert (transformer.parent / "ctranslate2-int8" / "model.bin").exists()
    for system in systems:
        seconds, text, tokens = system.translate(FORCED)
        assert seconds > 0 and len(text) == len(ids), system.name
        assert [len(t.split()) for t in text] == [FORCED] * len(ids), system.name
        assert tokens == (FORCED + 1) * len(ids), system.name  # and </s>
        _, text, _ = system.translate(None)  # as trained: the model's own lengths
        assert len(text) == len(ids) and all(isinstance(detokenized(t), str) for t in text), system.name


def test_detokenized_removes_bpe_and_moses_tokenization():
    assert detokenized("Ein Hund , der Schnee@@ ball jag@@ t .") == "Ein Hund, der Schneeball jagt."
