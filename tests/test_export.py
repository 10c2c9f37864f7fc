"""convs2s-export and convs2s_serving: a model trained by fairseq-train, exported, and
beam-searched with torch alone finds the plugin's hypotheses (fairseq-generate's, with the
plugin's task), with their scores."""
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch
from convs2s_serving import int8_linear

from cli_helpers import in_python, run, run_killing_a_worker, write_lines
from conftest import BIN, COMMAND_TIMEOUT, ROOT
from tiny_runs import prepare, prepared_for_generation, train


@pytest.fixture(scope="module")
def exported(tmp_path_factory, data_dir):
    """(prepared folder with BPE, checkpoint, exported folder)."""
    work = tmp_path_factory.mktemp("export")
    prepared = prepare(data_dir, work, "--bpe-merges", "500")
    train(prepared / "bin", work / "checkpoints", "--task", "convs2s_translation", "--max-update", "30")
    checkpoint = work / "checkpoints" / "checkpoint_last.pt"
    run("convs2s-export", "--path", checkpoint, "--data", prepared, "-o", work / "exported")
    return prepared, checkpoint, work / "exported"


@pytest.mark.parametrize("options", [
    ["--beam", 5],
    ["--beam", 1],  # greedy: the plugin reads the sources unprojected at every step
    ["--beam", 4, "--lenpen", 0.6, "--min-len", 3, "--max-len-a", 0.5, "--max-len-b", 4],
    ["--beam", 3, "--unkpen", -3],  # more <unk>: the penalty must be applied as fairseq does
])
def test_the_exported_model_finds_the_plugins_hypotheses(exported, options):
    """Every hypothesis of the n-best list (the whole beam) of every test sentence: the same
    target ids in the same order, and the same scores up to float32 rounding. A model trained
    30 updates scores many words alike: near ties are many, and all must fall the same way."""
    from convs2s_serving import ExportedModel, SearchOptions, beam_search

    prepared, checkpoint, folder = exported
    task, models, batches, generation = prepared_for_generation(prepared / "bin", checkpoint, *options,
                                                                "--nbest", options[1])
    generator = task.build_generator(models, generation)
    model = ExportedModel(folder)
    search = SearchOptions(beam=generation.beam, max_len_a=generation.max_len_a, max_len_b=generation.max_len_b,
                           min_len=generation.min_len, lenpen=generation.lenpen, unkpen=generation.unkpen)
    compared = 0
    for batch in batches:
        with torch.inference_mode():
            expected = task.inference_step(generator, models, batch)
            found = beam_search(model, batch["net_input"]["src_tokens"], search)
        for theirs, ours in zip(expected, found):
            assert [h.tokens.tolist() for h in ours] == [h["tokens"].tolist() for h in theirs]
            torch.testing.assert_close(torch.tensor([h.score for h in ours]),
                                       torch.stack([h["score"] for h in theirs]), rtol=0, atol=1e-4)
            for h, e in zip(ours, theirs):
                torch.testing.assert_close(h.positional_scores, e["positional_scores"], rtol=0, atol=1e-4)
            compared += 1
    assert compared == 20


def cooccurrence_candidates(prepared, path):
    """A candidates file (convs2s-align-dict --candidates's format) of the BPE'd training text:
    each source token's target tokens ranked by how many sentence pairs they share, without an
    aligner (a test needs a file that fits the dictionaries, not good alignments)."""
    from collections import Counter, defaultdict

    counts = defaultdict(Counter)
    source = (prepared / "bpe" / "train.en").read_text(encoding="utf-8").splitlines()
    target = (prepared / "bpe" / "train.de").read_text(encoding="utf-8").splitlines()
    for s, t in zip(source, target):
        for word in set(s.split()):
            counts[word].update(set(t.split()))
    lines = [" ".join([word] + [f"{t} {c}" for t, c in sorted(targets.items(), key=lambda tc: (-tc[1], tc[0]))])
             for word, targets in counts.items()]
    write_lines(path, lines)
    return path


@pytest.fixture(scope="module")
def selected(exported, tmp_path_factory):
    """(the folder exported in float32 with vocabulary selection, the options of fairseq-generate
    and convs2s-export that select the same candidates)."""
    prepared, checkpoint, _ = exported
    work = tmp_path_factory.mktemp("selected")
    candidates = cooccurrence_candidates(prepared, work / "candidates")
    options = ["--vocab-selection", candidates, "--vocab-most-common", 20, "--vocab-top-aligned", 6,
               "--vocab-rest-clusters", 8]
    run("convs2s-export", "--path", checkpoint, "--data", prepared, "-o", work / "exported", *options)
    return work / "exported", options


@pytest.mark.parametrize("quantize", ["none", "int8"])
def test_an_export_with_vocabulary_selection_finds_the_plugins_hypotheses(exported, selected, tmp_path, quantize):
    """``convs2s-export --vocab-selection``: each sentence's hypotheses are chosen among its own
    candidates, as fairseq-generate --vocab-selection chooses them (the same file and options,
    the words left out estimated from W_o's clusters): in float32 every hypothesis of every
    sentence and its scores; in int8 the best hypothesis of most sentences (the first step
    differs, see test_an_int8_export_searches_as_the_plugins_int8_and_serves_without_its_kernel).
    Selection narrows the words (a sentence's candidates are far fewer than the vocabulary),
    and ``vocabulary_selection=False`` scores every word again."""
    from convs2s_serving import ExportedModel, SearchOptions, beam_search

    prepared, checkpoint, folder = exported
    with_selection, selection = selected
    if quantize == "int8":
        with_selection = tmp_path / "int8"
        run("convs2s-export", "--path", checkpoint, "--data", prepared, "-o", with_selection, "--quantize", "int8",
            *selection)
    task, models, batches, generation = prepared_for_generation(prepared / "bin", checkpoint, "--beam", 4,
                                                                "--nbest", 4, "--quantize", quantize, *selection)
    generator = task.build_generator(models, generation)
    model = ExportedModel(with_selection)
    search = SearchOptions(beam=4)
    same = compared = 0
    for batch in batches:
        src_tokens = batch["net_input"]["src_tokens"]
        with torch.inference_mode():
            expected = task.inference_step(generator, models, task.vocabulary_selection.with_candidates(batch, False))
            found = beam_search(model, src_tokens, search)
        layer = model.output_layer_for(src_tokens, 4)
        assert layer.candidates.ge(0).sum(1).max() < model.vocabulary_size / 2
        for theirs, ours in zip(expected, found):
            compared += 1
            same += ours[0].tokens.tolist() == theirs[0]["tokens"].tolist()
            if quantize == "none":
                assert [h.tokens.tolist() for h in ours] == [h["tokens"].tolist() for h in theirs]
                torch.testing.assert_close(torch.tensor([h.score for h in ours]),
                                           torch.stack([h["score"] for h in theirs]), rtol=0, atol=1e-4)
    assert compared == 20 and same >= (20 if quantize == "none" else 14)
    every_word = ExportedModel(with_selection, vocabulary_selection=False)
    plain = ExportedModel(folder) if quantize == "none" else None
    with torch.inference_mode():
        src_tokens = batches[0]["net_input"]["src_tokens"]
        if plain is not None:
            assert ([h[0].tokens.tolist() for h in beam_search(every_word, src_tokens, search)]
                    == [h[0].tokens.tolist() for h in beam_search(plain, src_tokens, search)])


def test_convs2s_serve_scores_each_sentence_s_candidates_unless_told_not_to(exported, selected, tmp_path):
    """convs2s-serve over an export with selection translates as the runtime with selection
    (the plugin's hypotheses, above); ``--no-vocab-selection`` as the export without it."""
    from convs2s_serving import ExportedModel

    prepared, _, folder = exported
    source = prepared / "bpe" / "test.en"
    lines = source.read_text(encoding="utf-8").splitlines()

    def served(model, *options):
        out = tmp_path / "out.de"
        done = subprocess.run([str(BIN / "convs2s-serve"), str(model), "--tokens", "-i", str(source), "-o", str(out),
                               *options], capture_output=True, text=True, cwd=ROOT, timeout=COMMAND_TIMEOUT)
        assert done.returncode == 0, done.stderr
        return out.read_text(encoding="utf-8").splitlines()

    candidates_only = [" ".join(words) for words in
                       ExportedModel(selected[0]).translate_tokens([line.split() for line in lines])]
    assert served(selected[0]) == candidates_only
    assert served(selected[0], "--no-vocab-selection") == served(folder) != candidates_only


def test_convs2s_serve_translates_raw_text_as_convs2s_translate_does_without_fairseq(exported, tmp_path):
    """Raw lines in, the plugin's detokenized translations out, in the input's order, with an
    empty line kept empty: and fairseq (and the plugin) cannot even be imported."""
    prepared, checkpoint, folder = exported
    raw = prepared.parent / "raw" / "test.en"
    lines = raw.read_text(encoding="utf-8").splitlines()
    source = tmp_path / "in.en"
    write_lines(source, lines[:7] + [""] + lines[7:])
    expected = tmp_path / "expected.de"
    run("convs2s-translate", "--path", checkpoint, "--data", prepared, "-i", source, "-o", expected)
    out = tmp_path / "out.de"
    blocked = ("import sys; sys.modules.update(fairseq=None, fairseq_convs2s_ext=None); "
               "from convs2s_serving.cli import main; sys.exit(main(sys.argv[1:]))")
    done = subprocess.run([sys.executable, "-c", blocked, str(folder), "-i", str(source), "-o", str(out)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=COMMAND_TIMEOUT)
    assert done.returncode == 0, done.stderr
    assert out.read_text(encoding="utf-8") == expected.read_text(encoding="utf-8")
    assert out.read_text(encoding="utf-8").splitlines()[7] == ""
    assert "convs2s-serve: 21 sentences in" in done.stderr


def test_workers_translate_as_one_process_and_end(exported, tmp_path):
    """``convs2s-serve --workers 2`` (``ExportedModel(..., workers=2)``): processes side by side,
    each batch taken by whichever is free, the longest first; the same lines in the input's
    order as one process, and the processes end with the model."""
    prepared, _, folder = exported
    lines = (prepared.parent / "raw" / "test.en").read_text(encoding="utf-8").splitlines()
    source = tmp_path / "in.en"
    write_lines(source, lines)
    one, two = tmp_path / "one.de", tmp_path / "two.de"
    run("convs2s-serve", folder, "-i", source, "-o", one, "--batch-size", 3)
    log = run("convs2s-serve", folder, "-i", source, "-o", two, "--batch-size", 3, "--workers", 2)
    assert two.read_text(encoding="utf-8") == one.read_text(encoding="utf-8")
    assert f"convs2s-serve: {len(lines)} sentences in" in log and "2 workers of" in log
    # in a process of its own: the pool's barrier starts multiprocessing's resource tracker, which
    # lives as long as its process (test_runtime.py counts this process's children)
    # and raw text is tokenized and detokenized by the workers: this process never loads the tokenizer
    output = in_python(
        "import sys\n"
        "from convs2s_serving import ExportedModel, translate\n"
        f"tokens = [line.split() for line in open({str(prepared / 'bpe' / 'test.en')!r}, encoding='utf-8')]\n"
        f"with ExportedModel({str(folder)!r}, workers=2) as model:\n"
        "    processes = list(model.pool._processes.values())\n"
        f"    same = model.translate_tokens(tokens, batch_size=4) == ExportedModel({str(folder)!r}).translate_tokens(tokens)\n"
        f"    raw = translate(model, open({str(source)!r}, encoding='utf-8').read().splitlines(), batch_size=3)\n"
        f"same_text = raw == open({str(one)!r}, encoding='utf-8').read().splitlines()\n"
        "print(same, same_text, 'sacremoses' in sys.modules, len(processes), any(p.is_alive() for p in processes))")
    assert output.splitlines()[-1] == "True True False 2 False"
    refused = run("convs2s-serve", folder, "-i", source, "--workers", 0, check=False)
    assert refused.returncode != 0
    assert refused.stdout.strip().splitlines() == ["convs2s-serve: error: --workers must be at least 1, not 0"]


def test_an_int8_export_searches_as_the_plugins_int8_and_serves_without_its_kernel(exported, tmp_path):
    """``--quantize int8``: the layers are calls of the int8 kernel's torch operation in the
    program, and the search finds the plugin's int8 hypotheses on most sentences (not all:
    the plugin's first step reads the sources unprojected, through the attention's int8
    layers). Without the kernel (no vectorized code), the operation's torch fallback
    writes the same translations, bit for bit the same numbers, with fairseq unimportable."""
    import json
    import zipfile

    from convs2s_serving import ExportedModel, SearchOptions, beam_search

    prepared, checkpoint, _ = exported
    folder = tmp_path / "int8"
    said = run("convs2s-export", "--path", checkpoint, "--data", prepared, "-o", folder, "--quantize", "int8")
    assert json.loads((folder / "model.json").read_text())["quantize"] == "int8"
    assert "Warning" not in said, said  # torch's packaging had a remark on a buffer that was a view
    targets = {}
    for name in ("encoder", "step"):
        with zipfile.ZipFile(folder / f"{name}.pt2") as archive:
            program = next(n for n in archive.namelist() if n.endswith("models/model.json"))
            nodes = json.loads(archive.read(program))["graph_module"]["graph"]["nodes"]
        targets[name] = [node["target"] for node in nodes]
        assert "torch.ops.aten.linear.default" not in targets[name], name
    assert targets["step"].count("torch.ops.convs2s.int8_linear.default") >= 3  # fc1, the convolutions
    output_layer = torch.load(folder / "output.pt", weights_only=True)  # W_o, which the runtime multiplies
    assert sorted(output_layer) == ["bias", "weight_int8", "weight_scale"]
    assert output_layer["weight_int8"].dtype == torch.int8

    task, models, batches, generation = prepared_for_generation(prepared / "bin", checkpoint, "--beam", 5,
                                                                "--quantize", "int8")
    # the encoder's layers, and each attention's two projections of the source (keys, values)
    layers = sum(isinstance(m, torch.nn.Linear) for m in models[0].encoder.modules())
    attending = len(models[0].decoder.attending_layers)
    assert targets["encoder"].count("torch.ops.convs2s.int8_linear.default") == layers + 2 * attending
    generator = task.build_generator(models, generation)
    model = ExportedModel(folder)
    same = compared = 0
    for batch in batches:
        with torch.inference_mode():
            expected = task.inference_step(generator, models, batch)
            found = beam_search(model, batch["net_input"]["src_tokens"], SearchOptions(beam=5))
        for theirs, ours in zip(expected, found):
            same += ours[0].tokens.tolist() == theirs[0]["tokens"].tolist()
            compared += 1
    assert compared == 20 and same >= 15, same

    source = prepared.parent / "raw" / "test.en"
    # the serving processes multiply with the product the export was quantized for, rather than
    # each measuring its own (two measurements near the margin could choose differently)
    product = {int8_linear.PRODUCT_ENV: int8_linear.chosen_product()}
    outputs = []
    for env in (product, {**product, "ATEN_CPU_CAPABILITY": "default"}):
        out = tmp_path / f"out{len(outputs)}.de"
        blocked = ("import sys; sys.modules.update(fairseq=None, fairseq_convs2s_ext=None); "
                   "from convs2s_serving.cli import main; sys.exit(main(sys.argv[1:]))")
        done = subprocess.run([sys.executable, "-c", blocked, str(folder), "-i", str(source), "-o", str(out)],
                              capture_output=True, text=True, cwd=tmp_path, timeout=COMMAND_TIMEOUT,
                              env={**os.environ, **env})
        assert done.returncode == 0, done.stderr
        outputs.append(out.read_text(encoding="utf-8"))
    assert "int8_linear kernel is not used" in done.stderr
    assert outputs[0] == outputs[1] and len(outputs[0].splitlines()) == 20

    # Served where oneDNN multiplies int8 without VNNI (as on an AVX2 CPU), whose int8 sums are
    # exact only for 7-bit weights: an export quantized to 8 bits (on a CPU with VNNI) is refused
    # in one line; one quantized to 7 bits (exported on such a CPU) serves as it does here.
    # Where torch's int8 product does not go through oneDNN (an AVX2-only AMD EPYC), the switch
    # changes nothing: what it sums exactly held to AVX2 is measured, not assumed.
    levels = json.loads((folder / "model.json").read_text())["int8_weight_levels"]
    held = subprocess.run([sys.executable, "-c", "from convs2s_serving.int8_linear import weight_levels; "
                           "print(weight_levels())"], capture_output=True, text=True, check=True,
                          timeout=COMMAND_TIMEOUT, env={**os.environ, **product, "ONEDNN_MAX_CPU_ISA": "AVX2"}
                          ).stdout.strip()
    out = tmp_path / "avx2.de"
    done = subprocess.run([sys.executable, "-c", blocked, str(folder), "-i", str(source), "-o", str(out)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=COMMAND_TIMEOUT,
                          env={**os.environ, **product, "ONEDNN_MAX_CPU_ISA": "AVX2"})
    if held == "63" and levels > 63:
        assert done.returncode != 0 and not out.exists() and "Traceback" not in done.stderr
        assert re.search(r"model\.json: its int8 weights reach 127, and this CPU's int8 product sums them exactly "
                         r"only up to 63 \(no VNNI\): export it again on a CPU like this one", done.stderr), done.stderr
    else:
        assert done.returncode == 0 and out.read_text(encoding="utf-8") == outputs[0], done.stderr
    # unpinned, the serving process takes the product that sums the export's weights exactly
    # (fbgemm, 7-bit rows), whichever it measured the faster: it serves
    if held == "63" and levels > 63 and int8_linear.fbgemm_available():
        unpinned = {k: v for k, v in os.environ.items() if k != int8_linear.PRODUCT_ENV}
        done = subprocess.run([sys.executable, "-c", blocked, str(folder), "-i", str(source), "-o", str(out)],
                              capture_output=True, text=True, cwd=tmp_path, timeout=COMMAND_TIMEOUT,
                              env={**unpinned, "ONEDNN_MAX_CPU_ISA": "AVX2"})
        assert done.returncode == 0 and len(out.read_text(encoding="utf-8").splitlines()) == 20, done.stderr


def test_exporting_an_int8_model_leaves_its_state_dict_as_it_was(exported, tmp_path):
    """The int8 weights are stored as weights for the export only: the model's state_dict
    (which quantization leaves without them) is the same after."""
    from fairseq_convs2s_ext.generation.export import export
    from fairseq_convs2s_ext.generation.quantization import quantize_

    prepared, checkpoint, _ = exported
    _, (model,), _, _ = prepared_for_generation(prepared / "bin", checkpoint)
    quantize_([model])
    before = set(model.state_dict())
    export(model, tmp_path / "int8")
    assert set(model.state_dict()) == before and not any("weight_int8" in key for key in before)


@pytest.mark.parametrize("problem", ["no folder", "not exported", "newer format", "damaged json", "not utf-8",
                                     "zero beam", "no output layer", "another output layer", "another selection",
                                     "selection out of the vocabulary", "damaged selection record"])
def test_bad_input_is_one_line_and_writes_nothing(exported, selected, tmp_path, problem):
    from convs2s_serving.translator import FORMAT

    _, _, folder = exported
    if problem == "damaged selection record":
        text = (selected[0] / "model.json").read_text()
        folder = linked_copy(selected[0], tmp_path / "copy", "model.json")
        (folder / "model.json").write_text(text.replace('"rest_clusters": ', '"rest_clusters": -'))
    elif "selection" in problem:  # the tables of another model, or a damaged one
        tables = torch.load(selected[0] / "selection.pt", weights_only=True)
        folder = linked_copy(selected[0], tmp_path / "copy", "selection.pt")
        if problem == "another selection":
            tables["aligned"] = tables["aligned"][:-1]
        else:
            tables["always"][-1] = len(tables["rest_labels"])
        torch.save(tables, folder / "selection.pt")
    source, out = tmp_path / "in.en", tmp_path / "out.de"
    write_lines(source, ["A dog runs."])
    if problem == "no folder":
        folder = tmp_path / "missing"
    elif problem == "not exported":
        folder = tmp_path
    elif problem in ("newer format", "damaged json"):
        text = (folder / "model.json").read_text()
        folder = linked_copy(folder, tmp_path / "copy", "model.json")
        (folder / "model.json").write_text(text.replace(f'"format": {FORMAT}', '"format": 99')
                                           if problem == "newer format" else text[: len(text) // 2])
    elif problem == "no output layer":  # a folder copied in part
        folder = linked_copy(folder, tmp_path / "copy", "output.pt")
    elif problem == "another output layer":
        layer = torch.load(folder / "output.pt", weights_only=True)
        folder = linked_copy(folder, tmp_path / "copy", "output.pt")
        torch.save({**layer, "bias": layer["bias"][:-1]}, folder / "output.pt")
    elif problem == "not utf-8":
        source.write_bytes("Caf\xe9\n".encode("latin-1"))
    options = ["--beam", "0"] if problem == "zero beam" else []
    done = subprocess.run([str(BIN / "convs2s-serve"), str(folder), "-i", str(source), "-o", str(out), *options],
                          capture_output=True, text=True, cwd=ROOT, timeout=COMMAND_TIMEOUT)
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("convs2s-serve: error: "), done.stderr
    named = {"no folder": str(folder), "not exported": "convs2s-export", "newer format": "convs2s-export",
             "damaged json": str(folder / "model.json"), "not utf-8": str(source), "zero beam": "--beam",
             "no output layer": f"{folder / 'output.pt'}: missing", "another output layer": str(folder / "output.pt"),
             "another selection": str(folder / "selection.pt"),
             "selection out of the vocabulary": str(folder / "selection.pt"),
             "damaged selection record": str(folder / "model.json")}
    assert named[problem] in lines[0]
    assert not out.exists()


def test_export_refuses_a_folder_as_checkpoint_in_one_line(exported, tmp_path):
    prepared, checkpoint, _ = exported
    done = subprocess.run([str(BIN / "convs2s-export"), "--path", str(checkpoint.parent), "--data", str(prepared),
                           "-o", str(tmp_path / "out")], capture_output=True, text=True, cwd=ROOT,
                          timeout=COMMAND_TIMEOUT)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        f"convs2s-export: error: {checkpoint.parent}: a folder, not a checkpoint: --path takes a file, "
        "e.g. checkpoints/checkpoint_best.pt"]
    assert not (tmp_path / "out").exists()


def linked_copy(folder, copy, but):
    """``copy``: links to every file of ``folder`` but the one named ``but``, for the test to write."""
    copy.mkdir()
    for f in folder.iterdir():
        if f.name != but:
            (copy / f.name).symlink_to(f)
    return copy


def rewritten(archive, out, program=None, entries=None):
    """A copy of the .pt2 ``archive`` at ``out`` with its program's JSON passed through
    ``program`` (a function editing the parsed dict) and ``entries`` ({name suffix: bytes})
    replacing or adding entries."""
    import json
    import zipfile

    entries = dict(entries or {})
    with zipfile.ZipFile(archive) as source, zipfile.ZipFile(out, "w") as target:
        prefix = source.namelist()[0].split("/")[0]
        for name in source.namelist():
            data = source.read(name)
            if name.endswith("models/model.json") and program:
                document = json.loads(data)
                program(document)
                data = json.dumps(document).encode()
            suffix = name[len(prefix) + 1:]
            target.writestr(name, entries.pop(suffix, data))
        for suffix, data in entries.items():
            target.writestr(f"{prefix}/{suffix}", data)
    return out


class RunsCode:
    """A pickle that runs ``touch MARKER`` when unpickled."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        import os

        return os.system, (f"touch {self.marker}",)


def hostile(kind, archive, out, marker):
    import json
    import pickle

    command = f"__import__('os').system('touch {marker}')"
    if kind == "guard":
        return rewritten(archive, out, lambda p: p["guards_code"].append(command))
    if kind == "shape expression":
        def edit(p):
            text = json.dumps(p).replace("Symbol('s", "Symbol(" + command + " or 's", 1)
            p.clear()
            p.update(json.loads(text))
        return rewritten(archive, out, edit)
    if kind == "operation":
        def edit(p):
            p["graph_module"]["graph"]["nodes"][0]["target"] = "torch.serialization.load"
        return rewritten(archive, out, edit)
    if kind == "pickled weight":
        import zipfile

        with zipfile.ZipFile(archive) as source:
            name = next(n for n in source.namelist() if n.endswith("model_weights_config.json"))
            config = json.loads(source.read(name))
        first = next(iter(config["config"].values()))
        first["use_pickle"] = True
        return rewritten(archive, out, entries={"data/weights/model_weights_config.json": json.dumps(config).encode(),
                                                "data/weights/" + first["path_name"]: pickle.dumps(RunsCode(marker))})
    if kind == "sample inputs":
        return rewritten(archive, out, entries={"data/sample_inputs/model.pt": pickle.dumps(RunsCode(marker))})
    if kind == "extra entry":
        return rewritten(archive, out, entries={"data/constants/tensor_0": pickle.dumps(RunsCode(marker))})
    raise ValueError(kind)


HOSTILE = ["guard", "shape expression", "operation", "pickled weight", "sample inputs", "extra entry"]


@pytest.mark.parametrize("kind", HOSTILE)
def test_a_hostile_archive_is_refused_before_torch_reads_it(exported, tmp_path, kind):
    """A step program carrying code where torch.export.load would run it: refused, naming the
    file and what it holds, and the code never runs."""
    from convs2s_serving import ExportedModel
    from convs2s_serving.safe_loading import UnsafeArchive

    _, _, folder = exported
    copy, marker = linked_copy(folder, tmp_path / "hostile", "step.pt2"), tmp_path / "ran"
    hostile(kind, folder / "step.pt2", copy / "step.pt2", marker)
    with pytest.raises(UnsafeArchive, match=f"^{copy / 'step.pt2'}: holds .*: not loaded"):
        ExportedModel(copy)
    assert not marker.exists()


def test_the_archive_torch_loads_is_the_one_checked(exported, tmp_path, monkeypatch):
    """A step program replaced by a hostile one just after its check (by whoever else may write
    the folder while the model loads) is not what torch reads: the bytes checked are loaded."""
    from convs2s_serving import ExportedModel, SearchOptions, beam_search, safe_loading

    _, _, folder = exported
    copy, marker = linked_copy(folder, tmp_path / "raced", "step.pt2"), tmp_path / "ran"
    shutil.copy(folder / "step.pt2", copy / "step.pt2")
    swapped = hostile("guard", folder / "step.pt2", tmp_path / "hostile.pt2", marker)
    check = safe_loading.check_archive

    def check_then_replace(path, *data):
        check(path, *data)
        if path.endswith("step.pt2"):
            os.replace(swapped, path)  # the race, at its worst moment

    monkeypatch.setattr(safe_loading, "check_archive", check_then_replace)
    model = ExportedModel(copy)
    assert (copy / "step.pt2").read_bytes() != (folder / "step.pt2").read_bytes()  # it was replaced
    assert not marker.exists()
    with torch.inference_mode():
        assert beam_search(model, torch.tensor([[5, 6, 7, model.eos]]), SearchOptions(beam=2))[0]


@pytest.mark.parametrize("name", ["output.pt", "selection.pt"])
def test_a_hostile_output_layer_or_selection_is_refused_and_never_run(selected, tmp_path, name):
    """``output.pt`` (W_o's tensors) and ``selection.pt`` (the candidate tables) are read by
    torch's weights_only unpickler alone: a pickle that would run code is refused, naming the
    file, and the code never runs."""
    import pickle

    from convs2s_serving import ExportedModel
    from convs2s_serving.safe_loading import UnsafeArchive

    folder, _ = selected
    copy, marker = linked_copy(folder, tmp_path / "hostile", name), tmp_path / "ran"
    (copy / name).write_bytes(pickle.dumps({"weight": RunsCode(marker)}))
    with pytest.raises(UnsafeArchive, match=f"^{copy / name}: holds what torch's safe unpickler refuses"):
        ExportedModel(copy)
    assert not marker.exists()
    # torch.load without weights_only would have run it
    subprocess.run([sys.executable, "-c", f"import torch; torch.load({str(copy / name)!r}, weights_only=False)"],
                   capture_output=True, cwd=tmp_path, timeout=COMMAND_TIMEOUT)
    assert marker.exists()


@pytest.mark.parametrize("selection", [False, True])
def test_every_step_of_a_batch_writes_its_logits_into_the_same_memory(exported, selected, selection):
    """The step program returns features; W_o multiplies them into one logits tensor a
    batch, over every word or over each sentence's candidates, so that no step touches fresh
    memory (the module's docstring of export says what that cost)."""
    from convs2s_serving import ExportedModel, SearchOptions, beam_search

    prepared, checkpoint, folder = exported
    _, _, batches, _ = prepared_for_generation(prepared / "bin", checkpoint)
    model = ExportedModel(selected[0] if selection else folder)
    written = []
    output_layer_for = model.output_layer_for

    def recording(src_tokens, beam):
        layer = output_layer_for(src_tokens, beam)

        def logits(features, compute=layer.logits):
            out = compute(features)
            written.append(out.data_ptr())
            return out

        layer.logits = logits
        return layer

    model.output_layer_for = recording
    with torch.inference_mode():
        beam_search(model, batches[0]["net_input"]["src_tokens"], SearchOptions(beam=5, min_len=4, max_len_b=6))
    # steps 1 to 4 at least (--min-len 4); the first, a row a sentence, may take less memory
    assert len(written) >= 5 and set(written[1:]) == {written[1]}


def test_convs2s_serve_refuses_a_hostile_folder_in_one_line(exported, tmp_path):
    _, _, folder = exported
    copy, marker = linked_copy(folder, tmp_path / "hostile", "step.pt2"), tmp_path / "ran"
    hostile("guard", folder / "step.pt2", copy / "step.pt2", marker)
    done = subprocess.run([str(BIN / "convs2s-serve"), str(copy), "--tokens"], input="a dog\n",
                          capture_output=True, text=True, cwd=ROOT, timeout=COMMAND_TIMEOUT)
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"convs2s-serve: error: {copy / 'step.pt2'}: holds a guard"), \
        done.stderr
    assert not marker.exists() and not done.stdout


@pytest.mark.parametrize("kind", ["shape expression", "pickled weight"])
def test_torch_export_load_alone_would_run_the_hostile_code(exported, tmp_path, kind):
    """The threat is real: torch.export's own loader runs these archives' code."""
    _, _, folder = exported
    marker = tmp_path / "ran"
    archive = hostile(kind, folder / "step.pt2", tmp_path / "step.pt2", marker)
    subprocess.run([sys.executable, "-c", f"import torch; torch.export.load({str(archive)!r}).module()"],
                   capture_output=True, cwd=tmp_path, timeout=COMMAND_TIMEOUT)
    assert marker.exists()


@pytest.mark.parametrize("shapes", [
    dict(encoder_layers="[(16, 3), (24, 2), (24, 1), (16, 4)]", decoder_layers="[(16, 2), (24, 3), (24, 1), (16, 4)]",
         decoder_attention="[True, False, True, True]"),
    dict(share_input_output_embed=True),
], ids=["widths, kernels and attention vary", "tied output embedding"])
def test_any_layout_exports_and_searches_as_fairseq(tmp_path, shapes):
    """Residual projections between widths, kernels of width 1, 2 and 4, layers without
    attention, W_o tied to the embeddings (fc2 not folded): the export passes its own safety
    check, and its search finds fairseq's hypotheses and scores for left-padded sources."""
    from fairseq.sequence_generator import SequenceGenerator

    from convs2s_serving import ExportedModel, SearchOptions, beam_search
    from fairseq_convs2s_ext.generation.export import export
    from model_helpers import build, with_random_biases

    torch.manual_seed(0)
    model, d = build(**shapes)
    with_random_biases(model)
    model.make_generation_fast_()
    export(model, tmp_path / "exported")
    exported = ExportedModel(tmp_path / "exported")
    lengths = torch.tensor([7, 3, 5])
    src_tokens = torch.full((3, 7), d.pad())
    for row, length in enumerate(lengths.tolist()):
        src_tokens[row, 7 - length:-1] = torch.randint(d.nspecial, len(d), (length - 1,))
        src_tokens[row, -1] = d.eos()
    generator = SequenceGenerator([model], d, beam_size=4, max_len_b=9)
    with torch.inference_mode():
        expected = generator.generate([model], {"net_input": {"src_tokens": src_tokens, "src_lengths": lengths}})
        found = beam_search(exported, src_tokens, SearchOptions(beam=4, max_len_b=9))
    for theirs, ours in zip(expected, found):
        assert [h.tokens.tolist() for h in ours] == [h["tokens"].tolist() for h in theirs]
        torch.testing.assert_close(torch.tensor([h.score for h in ours]), torch.stack([h["score"] for h in theirs]),
                                   rtol=0, atol=1e-5)


def test_compiled_programs_find_the_same_hypotheses_and_are_built_once(exported, tmp_path, monkeypatch):
    """``--compile`` (AOTInductor): an int8 export's n-best lists and scores as its programs run
    from Python find them (the first step hands the step expanded windows, which it would read
    wrongly unless copied), the libraries built once into the cache and loaded from it after;
    and ``convs2s-serve --compile`` writes what ``convs2s-serve`` writes, from the same
    libraries."""
    from convs2s_serving import ExportedModel, SearchOptions, beam_search
    from convs2s_serving.compiled import CompiledProgram

    prepared, checkpoint, _ = exported
    folder, cache = tmp_path / "int8", tmp_path / "cache"
    run("convs2s-export", "--path", checkpoint, "--data", prepared, "-o", folder, "--quantize", "int8")
    monkeypatch.setenv("CONVS2S_SERVING_CACHE", str(cache))
    compiled, plain = ExportedModel(folder, compile=True), ExportedModel(folder)
    assert isinstance(compiled.encoder, CompiledProgram) and isinstance(compiled.decoder_step, CompiledProgram)
    libraries = sorted(os.path.basename(program.library) for program in (compiled.encoder, compiled.decoder_step))
    assert sorted(os.listdir(cache)) == libraries and libraries[0].startswith("encoder-")
    assert all(os.stat(cache / library).st_mode & 0o077 == 0 for library in libraries)
    _, _, batches, _ = prepared_for_generation(prepared / "bin", checkpoint)
    search = SearchOptions(beam=4, min_len=3)
    for batch in batches:
        with torch.inference_mode():
            expected = beam_search(plain, batch["net_input"]["src_tokens"], search)
            found = beam_search(compiled, batch["net_input"]["src_tokens"], search)
        for theirs, ours in zip(expected, found):
            assert [h.tokens.tolist() for h in ours] == [h.tokens.tolist() for h in theirs]
            torch.testing.assert_close(torch.tensor([h.score for h in ours]), torch.tensor([h.score for h in theirs]),
                                       rtol=0, atol=1e-4)
    built = [os.stat(cache / library).st_mtime_ns for library in libraries]
    source = prepared.parent / "raw" / "test.en"
    outputs = []
    for options in ([], ["--compile"]):
        out = tmp_path / f"out{len(outputs)}.de"
        done = subprocess.run([str(BIN / "convs2s-serve"), str(folder), "-i", str(source), "-o", str(out), *options],
                              capture_output=True, text=True, cwd=ROOT, timeout=COMMAND_TIMEOUT,
                              env={**os.environ, "CONVS2S_SERVING_CACHE": str(cache)})
        assert done.returncode == 0, done.stderr
        outputs.append(out.read_text(encoding="utf-8"))
    assert outputs[0] == outputs[1] and len(outputs[0].splitlines()) == 20
    assert [os.stat(cache / library).st_mtime_ns for library in libraries] == built  # loaded, not built again
    assert sorted(os.listdir(cache)) == libraries


@pytest.mark.parametrize("problem", ["writable by others", "another user's", "hostile program", "no compiler"])
def test_compile_refuses_a_cache_others_could_write_and_a_hostile_program(exported, tmp_path, problem):
    """A compiled program is code: a cache folder (or library) that another user owns or may write is
    refused in one line, and a hostile program is refused before anything is compiled. Without a
    C++ compiler, one line too, and nothing half-written left in the cache."""
    _, _, folder = exported
    cache = tmp_path / "cache"
    cache.mkdir()
    marker = tmp_path / "ran"
    if problem == "writable by others":
        cache.chmod(0o777)
    elif problem == "another user's":
        if os.geteuid() != 0:
            pytest.skip("giving a folder to another user takes root")
        os.chown(cache, 12345, -1)
    elif problem == "hostile program":
        folder = linked_copy(folder, tmp_path / "hostile", "step.pt2")
        hostile("guard", exported[2] / "step.pt2", folder / "step.pt2", marker)
    compiler = {"CXX": str(tmp_path / "no-such-compiler")} if problem == "no compiler" else {}
    done = subprocess.run([str(BIN / "convs2s-serve"), str(folder), "--tokens", "--compile"], input="a dog\n",
                          capture_output=True, text=True, cwd=ROOT, timeout=COMMAND_TIMEOUT,
                          env={**os.environ, "CONVS2S_SERVING_CACHE": str(cache), **compiler})
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    if problem == "no compiler":  # after the line that says the step is being compiled
        assert lines[0].startswith("convs2s-serve: compiling ") and "Traceback" not in done.stderr, done.stderr
        lines = lines[1:]
    assert len(lines) == 1 and lines[0].startswith("convs2s-serve: error: "), done.stderr
    named = {"writable by others": f"{cache}: writable by others", "another user's": f"{cache}: owned by another user",
             "hostile program": f"{folder / 'step.pt2'}: holds a guard",
             "no compiler": f"{folder / 'encoder.pt2'}: torch's AOTInductor could not compile the program"}
    assert named[problem] in lines[0]
    assert not os.listdir(cache) and not marker.exists() and not done.stdout


def test_a_serve_worker_that_dies_is_one_line_and_writes_nothing(exported, tmp_path):
    """``convs2s-serve --workers 2`` whose worker is killed (as the kernel's out-of-memory killer
    would) ends with one line that says what happened, not a traceback, and writes nothing."""
    prepared, _, folder = exported
    source, out = tmp_path / "in.en", tmp_path / "out.de"
    source.write_text((prepared.parent / "raw" / "test.en").read_text(encoding="utf-8") * 200, encoding="utf-8")
    returncode, stderr = run_killing_a_worker("convs2s-serve", folder, "-i", source, "-o", out, "--workers", 2)
    assert returncode == 1, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("convs2s-serve: error: a worker process died"), stderr
    assert sorted(tmp_path.iterdir()) == [source]
