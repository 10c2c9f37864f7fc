"""bench.serving's systems on tiny models: CTranslate2 (float32 and int8) converting a fairseq
Transformer, fairseq's generator over it and ours in int8 all translate, and at equal work
every hypothesis of every system takes as many decoder steps; CTranslate2's vocabulary map
made from our candidates holds its translations to them, as vocabulary selection holds ours."""
import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ctranslate2", reason="bench.serving's peer: pip install ctranslate2 (a benchmark dependency)")

from bench.generation import generation_batches  # noqa: E402
from bench.models import convs2s_task, translation_task  # noqa: E402
from bench.serving import (ONE_TRANSLATOR, PEER, CTranslate2System, ExportedSystem, FairseqSystem,  # noqa: E402
                           converted, detokenized, held_instructions, unpinned_product_warning, vocabulary_map)
from convs2s_preprocess.stages.align import build_align_dict, find_aligner  # noqa: E402
from cli_helpers import run  # noqa: E402
from fairseq import checkpoint_utils  # noqa: E402
from tiny_runs import USER_DIR, prepare, train  # noqa: E402

FORCED = 7
REPO = Path(__file__).resolve().parents[1]


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


@pytest.fixture(scope="module")
def candidates(models):
    """The candidates file of the tiny data's training text (convs2s-align-dict --candidates)."""
    data_bin = models[0]
    train_text = data_bin.parent / "bpe" / "train"
    out = data_bin.parent / "candidates"
    build_align_dict(f"{train_text}.en", f"{train_text}.de", str(data_bin.parent / "align.dict"), find_aligner(),
                     str(out))
    return out


def options():
    return argparse.Namespace(beam=5, batch_size=8, threads=1)


def test_every_system_translates_every_sentence_and_forced_length_is_equal_work(models):
    data_bin, transformer, convs2s = models
    task, ours_task, int8_task = translation_task(data_bin), convs2s_task(data_bin), convs2s_task(data_bin, quantize="int8")
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
        FairseqSystem("ours float32", loaded(convs2s, ours_task), ours_task, options(), batches),
        FairseqSystem("ours int8", loaded(convs2s, int8_task), int8_task, options(), batches),
        ExportedSystem("ours exported", convs2s, data_bin, options(), batches),
    ]
    assert (transformer.parent / "ctranslate2-int8" / "model.bin").exists()
    translations = {}
    for system in systems:
        seconds, text, tokens = system.translate(FORCED)
        assert seconds > 0 and len(text) == len(ids), system.name
        # as many decoder steps a hypothesis: fairseq's generator scores </s> at a step of its
        # own, CTranslate2 takes none at its maximum length and writes a word there instead
        words = FORCED + 1 if isinstance(system, CTranslate2System) else FORCED
        assert [len(t.split()) for t in text] == [words] * len(ids), system.name
        assert not any(t.split()[-1] == "</s>" for t in text), system.name
        assert tokens == (FORCED + 1) * len(ids), system.name  # a token a step
        _, as_trained, tokens = system.translate(None)  # as trained: the model's own lengths
        assert len(as_trained) == len(ids) and all(isinstance(detokenized(t), str) for t in as_trained), system.name
        translations[system.name] = text, as_trained, tokens
    assert translations["ours exported"] == translations["ours float32"]  # torch alone, the plugin's hypotheses


def test_ctranslate2_takes_a_translator_a_thread_and_the_split_changes_no_translation(models):
    """The peer's --threads are translators of one thread each, the one-translator row one
    translator of all of them (bench.serving's "CTranslate2's threads"); both translate alike."""
    data_bin, transformer, _ = models
    task = translation_task(data_bin)
    ids = sorted(i for batch in generation_batches(task, 8) for i in batch["id"].tolist())
    lines = (data_bin / "test.en-de.en").read_text(encoding="utf-8").splitlines()
    sources = [lines[i].split() for i in ids]
    two_threads = argparse.Namespace(beam=5, batch_size=8, threads=2)
    model_dir = converted(transformer, data_bin, "int8")
    peer = CTranslate2System(PEER, model_dir, "int8", two_threads, sources)
    one = CTranslate2System(ONE_TRANSLATOR, model_dir, "int8", two_threads, sources, translators=1)
    assert (peer.translator.num_translators, one.translator.num_translators) == (2, 1)
    for forced in (FORCED, None):
        assert peer.translate(forced)[1:] == one.translate(forced)[1:], forced


def test_detokenized_removes_bpe_and_moses_tokenization():
    assert detokenized("Ein Hund , der Schnee@@ ball jag@@ t .") == "Ein Hund, der Schneeball jagt."


def test_the_vocabulary_map_holds_ctranslate2_to_our_candidates(models, candidates, tmp_path):
    """The map has our most common words under the empty key and each source word's aligned
    words; with it CTranslate2 writes only a sentence's candidates (one sentence a batch: it
    takes the union over a batch), where without it the untrained model strays outside them;
    and ours with vocabulary selection translates every sentence."""
    data_bin, transformer, convs2s = models
    task = translation_task(data_bin)
    selection_task = convs2s_task(data_bin, vocab_selection=candidates, quantize="int8", vocab_most_common=5,
                                  vocab_top_aligned=5)
    rule = selection_task.vocabulary_selection
    vmap = vocabulary_map(rule, task.source_dictionary, task.target_dictionary, tmp_path / "vmap.txt")
    lines = vmap.read_text(encoding="utf-8").splitlines()
    tgt = task.target_dictionary
    assert lines[0] == "\t" + " ".join(tgt[t] for t in rule.always.tolist() if t >= tgt.nspecial)
    assert len(lines[0].split()) == 5 and len(lines) > 100
    batches = generation_batches(task, 8)
    ids = sorted(i for batch in batches for i in batch["id"].tolist())
    source_lines = (data_bin / "test.en-de.en").read_text(encoding="utf-8").splitlines()
    sources = [source_lines[i].split() for i in ids]
    mapped = {line.split("\t")[0]: set(line.split("\t")[1].split()) for line in lines}
    allowed = [mapped[""].union(*(mapped.get(word, set()) for word in sentence)) | {"<unk>"} for sentence in sources]
    one_a_batch = argparse.Namespace(beam=5, batch_size=1, threads=1)
    _, text, _ = CTranslate2System("vmap", converted(transformer, data_bin, "int8", vmap), "int8", one_a_batch,
                                   sources, use_vmap=True).translate(FORCED)
    assert all(set(t.split()) <= words for t, words in zip(text, allowed))
    _, free, _ = CTranslate2System("int8", converted(transformer, data_bin, "int8"), "int8", one_a_batch,
                                   sources).translate(FORCED)
    assert not all(set(t.split()) <= words for t, words in zip(free, allowed))  # the map is what held it
    (model,), _ = checkpoint_utils.load_model_ensemble([str(convs2s)], task=selection_task)
    _, text, tokens = FairseqSystem("ours, selection", model, selection_task, options(), batches).translate(FORCED)
    assert len(text) == len(ids) and tokens == (FORCED + 1) * len(ids)


@pytest.mark.slow  # the benchmark's method, not the product's behaviour: make test-slow
def test_each_system_is_measured_in_a_fresh_process_of_its_own(models, candidates, tmp_path):
    """measure_each_alone builds each system in a process of its own (spawned: nothing of the
    others is loaded there; CTranslate2 never in the caller's) and gives each phase's result of
    each: the whole set translated, forced to the length at equal work; each phase is handed
    to the caller as it ends. Run in a bounded subprocess."""
    data_bin, transformer, convs2s = models
    task = translation_task(data_bin)
    selection = convs2s_task(data_bin, vocab_selection=candidates, quantize="int8").vocabulary_selection
    vmap = vocabulary_map(selection, task.source_dictionary, task.target_dictionary, tmp_path / "vmap.txt")
    sentences = sum(len(batch["id"]) for batch in generation_batches(task, 8))
    paths = ", ".join(f"Path({str(path)!r})" for path in (transformer, convs2s))
    script = f"""
import argparse, json, sys
from pathlib import Path
from bench.serving import PEER, Models, measure_each_alone
models = Models({paths}, None, Path({str(candidates)!r}), Path({str(vmap)!r}))
args = argparse.Namespace(beam=5, batch_size=8, threads=1, batches=None, repeats=1, forced_length={FORCED})
names = [PEER, PEER + ", vocabulary map", "ours int8, vocabulary selection"]
phases = []
results = measure_each_alone(names, models, args, Path({str(data_bin)!r}), {sentences},
                             lambda phase, by_name: phases.append([phase, sorted(by_name)]))
print(json.dumps(phases))
print(json.dumps({{phase: {{name: [r["text"], r["tokens"], r["sentences/s"]] for name, r in by_name.items()}}
                  for phase, by_name in results.items()}}))
print(json.dumps("ctranslate2" in sys.modules))
"""
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    phases_line, results_line, loaded_line = proc.stdout.strip().splitlines()[-3:]
    assert json.loads(loaded_line) is False
    results = json.loads(results_line)
    assert list(results) == ["as trained", "equal work"]
    assert json.loads(phases_line) == [[phase, sorted(by_name)] for phase, by_name in results.items()]
    for phase, by_name in results.items():
        assert len(by_name) == 3, phase
        for name, (text, tokens, speed) in by_name.items():
            assert len(text) == sentences and speed > 0, (phase, name)
            if phase == "equal work":  # as many decoder steps: CTranslate2 a word for ours' </s>
                words = FORCED + 1 if name.startswith(PEER) else FORCED
                assert [len(t.split()) for t in text] == [words] * sentences, name
                assert tokens == (FORCED + 1) * sentences, name


@pytest.mark.slow  # the benchmark's method, not the product's behaviour: make test-slow
def test_ours_in_a_process_a_thread_translates_as_one_process_of_one_thread(models):
    """The row of ours split as convs2s-translate --workers splits it: two processes of one
    thread share the batches out and translate, in both phases, what one process of one thread
    translates. Run in a bounded subprocess."""
    data_bin, transformer, convs2s = models
    script = f"""
import argparse, json
from pathlib import Path
from bench.serving import PROCESSES, Models, measure_each_alone
models = Models(Path({str(transformer)!r}), Path({str(convs2s)!r}), None, None, None)
def args(threads):
    return argparse.Namespace(beam=5, batch_size=8, threads=threads, batches=None, repeats=1, forced_length={FORCED})
split = measure_each_alone([PROCESSES], models, args(2), Path({str(data_bin)!r}), 1)
one = measure_each_alone(["ours int8"], models, args(1), Path({str(data_bin)!r}), 1)
print(json.dumps([[r[phase][name]["text"], r[phase][name]["tokens"]]
                  for r, name in ((split, PROCESSES), (one, "ours int8")) for phase in ("as trained", "equal work")]))
"""
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    split_trained, split_equal, one_trained, one_equal = json.loads(proc.stdout.strip().splitlines()[-1])
    sentences = sum(len(batch["id"]) for batch in generation_batches(translation_task(data_bin), 8))
    assert split_trained == one_trained and split_equal == one_equal
    assert len(split_equal[0]) == sentences and split_equal[1] == (FORCED + 1) * sentences


def test_systems_chooses_the_systems_and_keeps_the_peer(capsys):
    from bench.serving import COMPILED, SYSTEMS, parse_args

    assert parse_args(["--systems", f"{COMPILED}; ours int8"]).systems == [PEER, "ours int8", COMPILED]
    assert parse_args([]).systems is None and COMPILED in SYSTEMS
    with pytest.raises(SystemExit):
        parse_args(["--systems", "ours int16"])
    assert "--systems: no system 'ours int16'; the systems are: CTranslate2 float32;" in capsys.readouterr().err


def test_a_run_held_below_the_cpu_s_instructions_says_so_and_asks_to_pin_ours_int8_product():
    """Held to AVX2 by the libraries' switches, ours' int8 product must be pinned: fbgemm has no
    switch, and a process that measures it the faster runs the CPU's own instructions (five of
    six single-thread processes did, held to AVX2 on an AMD EPYC with AVX-512 VNNI)."""
    held = held_instructions({"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2", "PATH": "/bin"})
    assert held == {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    assert "CONVS2S_INT8_PRODUCT=int_mm" in unpinned_product_warning(held)
    assert unpinned_product_warning({**held, "CONVS2S_INT8_PRODUCT": "int_mm"}) is None
    assert unpinned_product_warning(held_instructions({"PATH": "/bin"})) is None

