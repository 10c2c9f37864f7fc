"""Checkpoints crafted to run code, or that cannot be read, through every path that loads one.

fairseq builds fconv, fconv_self_att and fconv_lm by passing strings of the stored
configuration to ``eval``. The attack: a real fconv checkpoint whose ``encoder_layers``
is an expression that runs a shell command, put into ``cfg['model']`` (or the older
``args``) and saved again. With the plugin loaded, each path must refuse the file with one
line naming it, and the command must not run.
"""
import argparse
import os

import pytest
import torch
from fairseq import checkpoint_utils

import fairseq_convs2s_ext  # noqa: F401  (safe loading)
from cli_helpers import run
from fairseq_convs2s_ext.checkpoints import CheckpointRefused, check_config
from fairseq_convs2s_ext.checkpoints.safe_loading import code_in

PAYLOAD = "[(32, 3)] * 2 if __import__('os').system('touch PWNED') == 0 else []"
FCONV = ["--arch", "fconv_iwslt_de_en", "--encoder-layers", "[(32, 3)] * 2", "--decoder-layers", "[(32, 3)] * 2",
         "--encoder-embed-dim", "32", "--decoder-embed-dim", "32", "--decoder-out-embed-dim", "32"]


@pytest.fixture(scope="module")
def data_bin(small_bin):
    return small_bin


@pytest.fixture(scope="module")
def fconv_checkpoint(data_bin, tmp_path_factory):
    """A real fconv checkpoint written by fairseq-train (the cfg form fairseq writes today)."""
    save_dir = tmp_path_factory.mktemp("fconv")
    run("fairseq-train", data_bin, *FCONV, "--optimizer", "nag", "--lr", "0.1", "--max-tokens", "1000",
        "--max-update", "2", "--save-dir", save_dir, "--no-epoch-checkpoints", "--disable-validation",
        "--num-workers", "0", "--no-progress-bar")
    return save_dir / "checkpoint_last.pt"


def poisoned(fconv_checkpoint, tmp_path, form="cfg", field="encoder_layers"):
    """The real fconv checkpoint with PAYLOAD in ``field`` of its cfg['model'] or its args."""
    state = torch.load(fconv_checkpoint, weights_only=False)
    model = argparse.Namespace(**vars(state["cfg"]["model"]))
    setattr(model, field, PAYLOAD)
    if form == "cfg":
        state["cfg"]["model"] = model
    else:  # fairseq's older layout: every option in one Namespace
        flat = {k: v for section in state["cfg"].values() if isinstance(section, dict) for k, v in section.items()}
        state["args"], state["cfg"] = argparse.Namespace(**{**flat, **vars(model)}), None
    path = tmp_path / f"evil-{form}.pt"
    torch.save(state, path)
    return path


def assert_refused(output, path, cwd):
    assert not (cwd / "PWNED").exists(), "the checkpoint ran its command"
    assert output.returncode != 0
    errors = [line for line in output.stdout.splitlines() if line.startswith(("fairseq-", "convs2s-"))]
    assert any(str(path) in line and "would run code" in line for line in errors), output.stdout[-3000:]
    assert "Traceback" not in output.stdout


@pytest.mark.parametrize("form", ["cfg", "args"])
def test_fairseq_generate_refuses_code_in_an_fconv_checkpoint(data_bin, fconv_checkpoint, tmp_path, form):
    path = poisoned(fconv_checkpoint, tmp_path, form)
    output = run("fairseq-generate", data_bin, "--user-dir", fairseq_convs2s_ext.__path__[0], "--path", path,
                 "--gen-subset", "test", "--beam", "2", cwd=tmp_path, check=False)
    assert_refused(output, path, tmp_path)


def test_fairseq_interactive_and_train_restore_refuse_it(data_bin, fconv_checkpoint, tmp_path):
    path = poisoned(fconv_checkpoint, tmp_path)
    user_dir = fairseq_convs2s_ext.__path__[0]
    output = run("fairseq-interactive", data_bin, "--user-dir", user_dir, "--path", path, "-s", "en", "-t", "de",
                 cwd=tmp_path, check=False, input="a dog runs .\n")
    assert_refused(output, path, tmp_path)
    output = run("fairseq-train", data_bin, "--user-dir", user_dir, *FCONV, "--optimizer", "nag", "--lr", "0.1",
                 "--max-tokens", "1000", "--max-update", "3", "--restore-file", path, "--save-dir", tmp_path / "ckpt",
                 "--disable-validation", "--num-workers", "0", cwd=tmp_path, check=False)
    assert_refused(output, path, tmp_path)


def test_python_api_and_import_refuse_it(data_bin, fconv_checkpoint, tmp_path, monkeypatch):
    from fairseq.models.fconv import FConvModel

    from fairseq_convs2s_ext.cli import import_fconv

    monkeypatch.chdir(tmp_path)
    path = poisoned(fconv_checkpoint, tmp_path)
    with pytest.raises(CheckpointRefused, match="would run code"):
        FConvModel.from_pretrained(str(tmp_path), checkpoint_file=path.name, data_name_or_path=str(data_bin))
    assert import_fconv.main([str(path), str(tmp_path / "out.pt"), "--source-dict", str(data_bin / "dict.en.txt"),
                              "--target-dict", str(data_bin / "dict.de.txt")]) == 1
    assert not (tmp_path / "PWNED").exists() and not (tmp_path / "out.pt").exists()


@pytest.mark.parametrize("arch, field", [("fconv_self_att", "self_attention"), ("fconv_self_att", "pretrained"),
                                         ("fconv_lm", "decoder_layers"), ("fconv_lm", "adaptive_softmax_cutoff")])
def test_other_families_that_fairseq_evaluates(tmp_path, monkeypatch, arch, field):
    """Any option of a stored Namespace is checked as the file is read, in args and in cfg."""
    monkeypatch.chdir(tmp_path)
    for state in ({"args": argparse.Namespace(arch=arch, **{field: PAYLOAD}), "model": {}},
                  {"cfg": {"model": argparse.Namespace(_name=arch, **{field: PAYLOAD})}, "model": {}}):
        torch.save(state, tmp_path / "evil.pt")
        with pytest.raises(CheckpointRefused, match=field):
            checkpoint_utils.load_checkpoint_to_cpu(str(tmp_path / "evil.pt"))
    assert not (tmp_path / "PWNED").exists()


def test_a_dict_configuration_is_checked_where_the_plugin_builds_models(small_bin, tmp_path, monkeypatch):
    """A configuration of plain dicts loads without any allowed class; convs2s_translation
    checks it before fairseq's fconv would evaluate it."""
    from fairseq import tasks
    from omegaconf import OmegaConf

    monkeypatch.chdir(tmp_path)
    task = tasks.setup_task(OmegaConf.create({"_name": "convs2s_translation", "data": str(small_bin),
                                              "source_lang": "en", "target_lang": "de"}))
    with pytest.raises(CheckpointRefused, match=r"model\.encoder_layers"):
        task.build_model(OmegaConf.create({"_name": "fconv", "arch": "fconv", "encoder_layers": PAYLOAD}))
    assert not (tmp_path / "PWNED").exists()
    with pytest.raises(CheckpointRefused, match=r"cfg\.model\.decoder_layers"):
        check_config({"model": {"decoder_layers": PAYLOAD}}, "cfg")


@pytest.mark.parametrize("text", ["[(512, 3)] * 20", "[(512, 3)] * 10 + [(768, 3)] * 3 + [(2048, 1)] * 2", "True",
                                  "[True, False]", "(0.9, 0.98)", "10000,50000,200000", "data-bin/wmt14.en-fr",
                                  "/home/me/my data/bin", "{'beam': 4}", "relu", ""])
def test_real_options_are_values(text):
    assert code_in(text) is None


@pytest.mark.parametrize("text, reason", [
    ("__import__('os').system('x')", "calls a function"), ("().__class__.__base__", "private attribute"),
    ("[x for x in y]", "loop"), ("lambda: 0", "defines a function"), ("9 ** 9 ** 9", "power"),
    ("[0] * 100000 * 100000", "repeats"), ("f'{x}'", "formats"),
])
def test_code_is_recognised(text, reason):
    assert reason in code_in(text)


def test_a_checkpoint_read_back_stays_a_plain_namespace(tmp_path):
    """What the plugin reads pickles as argparse.Namespace, so files it writes load anywhere."""
    torch.save({"args": argparse.Namespace(arch="fconv", encoder_layers="[(32, 3)]")}, tmp_path / "a.pt")
    state = torch.load(tmp_path / "a.pt", weights_only=True)
    torch.save(state, tmp_path / "b.pt")
    torch.serialization.clear_safe_globals()
    try:
        torch.serialization.add_safe_globals([argparse.Namespace])
        assert type(torch.load(tmp_path / "b.pt", weights_only=True)["args"]) is argparse.Namespace
    finally:
        torch.serialization.clear_safe_globals()
        fairseq_convs2s_ext.allow_fairseq_checkpoints()
    assert os.path.getsize(tmp_path / "b.pt") > 0


@pytest.mark.parametrize("damage", ["truncated", "random"])
def test_an_unreadable_checkpoint_is_one_line_naming_it(data_bin, fconv_checkpoint, tmp_path, damage):
    """A checkpoint cut short (a disk that filled up while fairseq copied checkpoint_best.pt) or
    random bytes: fairseq-generate says so in one line instead of a traceback."""
    data = fconv_checkpoint.read_bytes()
    path = tmp_path / "checkpoint_best.pt"
    path.write_bytes(data[: len(data) // 4] if damage == "truncated" else os.urandom(len(data)))
    output = run("fairseq-generate", data_bin, "--user-dir", fairseq_convs2s_ext.__path__[0], "--path", path,
                 "--gen-subset", "test", cwd=tmp_path, check=False)
    assert output.returncode != 0
    assert f"fairseq-generate: error: {path}: not a readable checkpoint" in output.stdout, output.stdout[-3000:]
    assert "Traceback" not in output.stdout
