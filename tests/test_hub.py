"""``ConvS2SModel.from_pretrained``: raw sentences in, translations out, from a folder written by
convs2s-prepare and checkpoints written by fairseq-train (Multi30k en-de)."""
import json
import math
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from cli_helpers import run, write_lines
from conftest import COMMAND_TIMEOUT, ROOT
from fairseq_convs2s_ext import ConvS2SModel
from convs2s_preprocess.stages.tokenize import normalize_and_tokenize
from tiny_runs import prepare, train

USER_DIR = ROOT / "fairseq_convs2s_ext"


@pytest.fixture(scope="module")
def bpe_model(tmp_path_factory, data_dir):
    """(prepared folder with BPE, checkpoint folder)."""
    work = tmp_path_factory.mktemp("hub-bpe")
    prepared = prepare(data_dir, work, "--bpe-merges", "500")
    train(prepared / "bin", work / "checkpoints")
    return prepared, work / "checkpoints"


@pytest.fixture(scope="module")
def word_model(tmp_path_factory, data_dir):
    """(word-level prepared folder with 100 words a side, checkpoint folder): most words are
    unknown, so the model writes <unk>."""
    work = tmp_path_factory.mktemp("hub-word")
    prepared = prepare(data_dir, work, "--no-bpe", "--nwords", "100")
    train(prepared / "bin", work / "checkpoints", "--task", "translation", "--max-update", "30")
    return prepared, work / "checkpoints"


def test_from_pretrained_tokenizes_and_segments_raw_text_as_prepare_did(bpe_model):
    prepared, checkpoints = bpe_model
    hub = ConvS2SModel.from_pretrained(checkpoints, data_name_or_path=prepared)
    assert hub.cfg.bpe.bpe_codes == str(prepared / "bpe" / "codes")
    raw = (prepared.parent / "raw" / "test.en").read_text(encoding="utf-8").splitlines()
    binarized = (prepared / "bin" / "test.en-de.en").read_text(encoding="utf-8").splitlines()
    assert [hub.apply_bpe(hub.tokenize(line)) for line in raw] == binarized
    for sentence in ("Tom's dog isn't well-known & loud.", "He said \"yes\" <b> 5 > 3"):
        assert hub.tokenize(sentence) == normalize_and_tokenize(sentence, "en")  # no &apos; &amp;
    # data_name_or_path may also be the binarized folder itself.
    assert ConvS2SModel.from_pretrained(checkpoints, data_name_or_path=prepared / "bin").cfg.bpe == hub.cfg.bpe


def test_translate_raw_sentences_with_beam_and_nbest(bpe_model, tmp_path):
    """The hub's translations are fairseq-interactive's for the same raw text, with fairseq's
    own tokenizer and BPE options set as the hub sets them."""
    prepared, checkpoints = bpe_model
    hub = ConvS2SModel.from_pretrained(checkpoints, data_name_or_path=prepared)
    raw = (prepared.parent / "raw" / "test.en").read_text(encoding="utf-8").splitlines()[:5]
    best = hub.translate(raw, beam=5)
    three = hub.translate(raw, beam=5, nbest=3)
    assert [h[0] for h in three] == best and all(len(h) == 3 for h in three)
    assert hub.translate(raw[0], beam=5, nbest=3) == three[0]
    assert hub.translate(raw[0], beam=5) == best[0]
    interactive = run("fairseq-interactive", prepared / "bin", "--user-dir", USER_DIR, "--path",
                      checkpoints / "checkpoint_best.pt", "--beam", "5", "--nbest", "3", "-s", "en", "-t", "de",
                      "--tokenizer", "moses", "--moses-no-escape", "--bpe", "subword_nmt",
                      "--bpe-codes", prepared / "bpe" / "codes", input="\n".join(raw) + "\n")
    detokenized = re.findall(r"^D-(\d+)\t(\S+)\t(.*)$", interactive, flags=re.M)
    assert [(int(i), text) for i, _, text in detokenized] == [(i, h) for i, hs in enumerate(three) for h in hs]
    scores = [float(score) * math.log(2) for _, score, _ in detokenized[::3]]  # printed in base 2
    generated = hub.generate([hub.encode(line) for line in raw], beam=5)
    assert [hypos[0]["score"].item() for hypos in generated] == pytest.approx(scores, abs=1e-4)
    with pytest.raises(ValueError, match="nbest=3 needs a beam"):
        hub.translate(raw[0], beam=2, nbest=3)


@pytest.mark.parametrize("quantize", ["none", "int8"])
def test_two_threads_translating_at_once_get_one_threads_translations(bpe_model, quantize):
    """A server may call one hub from several threads: each search keeps its own state, and the
    int8 products and the lean step's kernel let the other threads run while they work
    (tests/test_kernel_threads.py)."""
    prepared, checkpoints = bpe_model
    hub = ConvS2SModel.from_pretrained(checkpoints, data_name_or_path=prepared, quantize=quantize)
    raw = (prepared.parent / "raw" / "test.en").read_text(encoding="utf-8").splitlines()[:40]
    halves = [raw[::2], raw[1::2]]
    alone = [hub.translate(half, beam=5, nbest=2) for half in halves]
    with ThreadPoolExecutor(2) as pool:
        for _ in range(3):
            assert list(pool.map(lambda half: hub.translate(half, beam=5, nbest=2), halves)) == alone


def test_batches_are_fairseqs(bpe_model):
    """The hub's batches (what HubWorkers shares out) are those of fairseq's own hub batching."""
    from fairseq.hub_utils import GeneratorHubInterface

    prepared, checkpoints = bpe_model
    hub = ConvS2SModel.from_pretrained(checkpoints, data_name_or_path=prepared, batch_size=3)
    raw = (prepared.parent / "raw" / "test.en").read_text(encoding="utf-8").splitlines()
    tokens = [hub.encode(line) for line in raw]
    fairseqs = [sorted(batch["id"].tolist()) for batch in GeneratorHubInterface._build_batches(hub, tokens, False)]
    ours = hub.batches(tokens)
    assert [sorted(batch) for batch in ours] == fairseqs and len(ours) == 7
    lengths = [[tokens[i].numel() for i in batch] for batch in ours]
    assert all(a <= b for a, b in zip(sum(lengths, []), sum(lengths, [])[1:]))  # by length, shortest first


WORKERS_SCRIPT = """
import json, sys, torch
from fairseq_convs2s_ext import ConvS2SModel
from fairseq_convs2s_ext.models.hub_workers import HubWorkers
checkpoints, prepared, quantize = sys.argv[1:]
raw = open(prepared + "/../raw/test.en", encoding="utf-8").read().splitlines()
sentences = raw[:9] + [""] + raw[9:] + ["A dog runs."]
torch.set_num_threads(1)
hub = ConvS2SModel.from_pretrained(checkpoints, data_name_or_path=prepared, batch_size=3, quantize=quantize)
with HubWorkers(2, checkpoints, "checkpoint_best.pt", prepared, threads=1, batch_size=3, quantize=quantize) as w:
    print(json.dumps([hub.translate(sentences, beam=5, nbest=2), w.translate(sentences, beam=5, nbest=2),
                      hub.translate(sentences, beam=4, lenpen=0.5), w.translate(sentences, beam=4, lenpen=0.5)]))
"""


def test_workers_translate_as_the_hub_at_their_threads(bpe_model):
    """HubWorkers: two processes of one thread, fairseq's batches shared out, translate as the
    hub does at one thread (n-best, generation options, an empty sentence), batch for batch
    (float32 here; convs2s-translate's test covers int8). In a bounded subprocess."""
    prepared, checkpoints = bpe_model
    done = subprocess.run([sys.executable, "-c", WORKERS_SCRIPT, str(checkpoints), str(prepared), "none"],
                          capture_output=True, text=True, cwd=ROOT, timeout=COMMAND_TIMEOUT)
    assert done.returncode == 0, done.stderr
    hub_nbest, workers_nbest, hub_best, workers_best = json.loads(done.stdout.splitlines()[-1])
    assert workers_nbest == hub_nbest and workers_best == hub_best
    assert hub_nbest[9] == ["", ""] and hub_best[9] == "" and all(len(h) == 2 and h[0] for h in hub_nbest[:9])


def _with_task(checkpoint, task, out):
    state = torch.load(checkpoint, map_location="cpu")
    state["cfg"]["task"]["_name"] = task
    torch.save(state, out)
    return out


@pytest.mark.parametrize("task", ["translation", "convs2s_translation"])
def test_unknown_word_replacement_through_the_hub(word_model, tmp_path, task):
    """Each <unk> of the translation becomes the dictionary translation of a source word
    (or the word itself, without an entry), for a checkpoint of either task; the other words
    and the target dictionary stay as they were, so later calls translate the same."""
    prepared, checkpoints = word_model
    _with_task(checkpoints / "checkpoint_best.pt", task, tmp_path / "model.pt")
    hub = ConvS2SModel.from_pretrained(tmp_path, checkpoint_file="model.pt", data_name_or_path=prepared)
    sentence = "A young climber scales a rocky cliff near Yosemite."
    source = hub.tokenize(sentence).split()
    align_dict = tmp_path / "align.dict"
    write_lines(align_dict, [f"{word} [{word}]" for word in source if word != "cliff"])
    vocabulary = len(hub.tgt_dict)

    plain = hub.translate(sentence, beam=5).split()
    assert "<unk>" in plain
    copied = hub.translate(sentence, beam=5, replace_unk="").split()
    translated = hub.translate(sentence, beam=5, replace_unk=str(align_dict)).split()
    assert len(copied) == len(translated) == len(plain)
    for word, copy, translation in zip(plain, copied, translated):
        if word == "<unk>":
            assert copy in source and translation == (copy if copy == "cliff" else f"[{copy}]")
        else:
            assert copy == translation == word
    assert len(hub.tgt_dict) == vocabulary
    assert hub.translate(sentence, beam=5).split() == plain
    assert hub.translate([sentence], beam=5, nbest=2, replace_unk="")[0][0].split() == copied

    loaded_with_dict = ConvS2SModel.from_pretrained(tmp_path, checkpoint_file="model.pt", data_name_or_path=prepared,
                                                    replace_unk=str(align_dict))
    assert loaded_with_dict.translate(sentence, beam=5).split() == translated
    with pytest.raises(ValueError, match="source text"):
        hub.generate([hub.encode(sentence)], beam=5, replace_unk="")


def test_layer_attention_is_each_decoder_layers_attention(bpe_model):
    """The per-layer matrices are what each attention module computes in the model's forward
    pass, and their average is the attention the decoder returns in beam search (what
    --print-alignment and unknown-word replacement read)."""
    prepared, checkpoints = bpe_model
    hub = ConvS2SModel.from_pretrained(checkpoints, data_name_or_path=prepared)
    source, target = "Two dogs play in the snow.", "Zwei Hunde spielen im Schnee."
    attention = hub.layer_attention(source, target)
    assert attention.source_tokens == hub.apply_bpe(hub.tokenize(source)).split() + ["</s>"]
    assert attention.target_tokens == hub.apply_bpe("Zwei Hunde spielen im Schnee .").split() + ["</s>"]
    shape = (len(attention.target_tokens), len(attention.source_tokens))
    assert list(attention.layers) == [1, 2] and all(a.shape == shape for a in attention.layers.values())
    assert torch.allclose(attention.average, sum(attention.layers.values()) / 2)

    model = hub.models[0]
    seen = {}
    hooks = [module.register_forward_hook(lambda m, i, out, n=n: seen.__setitem__(n, out[1][0].clone()))
             for n, module in enumerate(model.decoder.attention, 1)]
    src = hub.encode(source)
    tgt = hub.tgt_dict.encode_line(hub.apply_bpe(hub.target_tokenizer.encode(target)), add_if_not_exist=False).long()
    with torch.no_grad():
        model(src[None], torch.tensor([src.numel()]), torch.cat([tgt[-1:], tgt[:-1]])[None])
    for hook in hooks:
        hook.remove()
    for n, matrix in attention.layers.items():
        assert torch.allclose(matrix, seen[n])

    own = hub.layer_attention(source)  # the model's own translation, by beam search
    with hub._attention(True):
        best = hub.generate([src], beam=5)[0][0]
    assert own.target_tokens == [hub.tgt_dict[t] for t in best["tokens"].tolist()]
    assert torch.allclose(own.average, best["attention"].t(), atol=1e-5)


def test_plot_attention_draws_each_layer_and_the_average(bpe_model, tmp_path):
    from matplotlib.image import imread

    from fairseq_convs2s_ext.attention_plot import plot_attention

    prepared, checkpoints = bpe_model
    hub = ConvS2SModel.from_pretrained(checkpoints, data_name_or_path=prepared)
    attention = hub.layer_attention("A man rides a bike.", "Ein Mann fährt Fahrrad.")
    figures = plot_attention(attention, tmp_path / "plots")
    expected = {"layer1": attention.layers[1], "layer2": attention.layers[2], "average": attention.average}
    assert sorted(figures) == sorted(str(tmp_path / "plots" / f"{name}.png") for name in expected)
    for name, matrix in expected.items():
        path = str(tmp_path / "plots" / f"{name}.png")
        axes = figures[path].axes[0]
        assert (axes.images[0].get_array() == matrix.numpy()).all()
        assert [t.get_text() for t in axes.get_xticklabels()] == attention.source_tokens
        assert [t.get_text() for t in axes.get_yticklabels()] == attention.target_tokens
        assert imread(path).shape[2] == 4  # a real PNG, RGBA
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == ["average.png", "layer1.png", "layer2.png"]


def test_plot_attention_command(bpe_model, tmp_path):
    prepared, checkpoints = bpe_model
    out = tmp_path / "attention"
    proc = subprocess.run(
        [sys.executable, "-m", "fairseq_convs2s_ext.cli.plot_attention", "--path", checkpoints / "checkpoint_best.pt",
         "--data", prepared, "--source", "Two dogs play in the snow.", "-o", out],
        cwd=ROOT, text=True, capture_output=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(proc.stdout.split()) == sorted(str(out / f"{n}.png") for n in ("average", "layer1", "layer2"))
    missing = subprocess.run(
        [sys.executable, "-m", "fairseq_convs2s_ext.cli.plot_attention", "--path", tmp_path / "none.pt",
         "--data", prepared, "--source", "x"], cwd=ROOT, text=True, capture_output=True)
    assert missing.returncode != 0 and "none.pt: no such checkpoint file" in missing.stderr
    assert "Traceback" not in missing.stderr
    damaged = tmp_path / "prepared"
    shutil.copytree(prepared / "bin", damaged / "bin")
    (damaged / "bin" / "dict.de.txt").write_text("und 5\nnocount\n", encoding="utf-8")
    malformed = subprocess.run(
        [sys.executable, "-m", "fairseq_convs2s_ext.cli.plot_attention", "--path", checkpoints / "checkpoint_best.pt",
         "--data", damaged, "--source", "x"], cwd=ROOT, text=True, capture_output=True)
    assert malformed.returncode != 0 and "Traceback" not in malformed.stderr, malformed.stderr[-3000:]
    assert malformed.stderr.splitlines()[-1] == (
        f"plot_attention.py: error: {damaged / 'bin' / 'dict.de.txt'}: not a fairseq dictionary: Incorrect dictionary "
        "format, expected '<token> <cnt> [flags]': \"nocount\"; use the dict.LANG.txt that fairseq-preprocess or "
        "convs2s-prepare wrote")


@pytest.mark.parametrize("task", ["translation", "convs2s_translation"])
def test_empty_and_over_long_sentences_whatever_the_task(word_model, tmp_path, task):
    """An empty sentence translates as empty (fairseq's stock task would invent one); one longer
    than the model takes is a ValueError saying so (fairseq's names a command-line flag)."""
    prepared, checkpoints = word_model
    _with_task(checkpoints / "checkpoint_best.pt", task, tmp_path / "model.pt")
    hub = ConvS2SModel.from_pretrained(tmp_path, checkpoint_file="model.pt", data_name_or_path=prepared)
    sentence = "A dog runs through the snow."
    best = hub.translate(sentence, beam=5)
    assert best != ""
    assert hub.translate("") == "" and hub.translate([sentence, "", " \t"], beam=5) == [best, "", ""]
    assert hub.translate(["", sentence], beam=5, nbest=2) == [["", ""], hub.translate(sentence, beam=5, nbest=2)]
    too_long = " ".join(["dog"] * 1100)
    with pytest.raises(ValueError, match=r"^sentence 1 is 1101 tokens long .*more than the 1024 the model takes: split it$"):
        hub.translate([sentence, too_long])
    with pytest.raises(ValueError, match=r"^sentence 0 is 1101 tokens long"):
        hub.generate([hub.encode(too_long)])
