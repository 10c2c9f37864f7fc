"""Checkpoints crafted to run code, or that cannot be read, through every path that loads one.

fairseq builds fconv, fconv_self_att and fconv_lm by passing strings of the stored
configuration to ``eval``. The attack: a real fconv checkpoint whose ``encoder_layers``
is an expression that runs a shell command, put into ``cfg['model']`` (as a Namespace or as
plain dicts, which torch loads without any allowed class) or the older ``args``, and saved
again. With the plugin loaded, each path (fairseq's commands with or without the plugin's
task, the hub, averaging, importing) must refuse the file with one line naming it and the
key, and the command must not run.
"""
import argparse
import ast
import os
import pathlib
import re
import tracemalloc

import fairseq
import pytest
import torch
from fairseq import checkpoint_utils
from hypothesis import given, settings
from hypothesis import strategies as st

import fairseq_convs2s_ext  # noqa: F401  (safe loading)
from cli_helpers import run
from fairseq_convs2s_ext.checkpoints import CheckpointRefused, check_config
from fairseq_convs2s_ext.checkpoints.safe_loading import EVALUATED, checked
from fairseq_convs2s_ext.modules import parse_layers

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
    """The real fconv checkpoint with PAYLOAD in ``field`` of its cfg['model'] (a Namespace, or a
    plain dict: ``form="dict"``) or its args."""
    state = torch.load(fconv_checkpoint, weights_only=False)
    model = argparse.Namespace(**vars(state["cfg"]["model"]))
    setattr(model, field, PAYLOAD)
    if form in ("cfg", "dict"):
        state["cfg"]["model"] = model if form == "cfg" else dict(vars(model))
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
    assert any(str(path) in line and "encoder_layers" in line and "is refused" in line for line in errors), \
        output.stdout[-3000:]
    assert "Traceback" not in output.stdout


@pytest.mark.parametrize("form, task", [("cfg", []), ("args", []), ("dict", []),
                                        ("dict", ["--task", "convs2s_translation"])])
def test_fairseq_generate_refuses_code_in_an_fconv_checkpoint(data_bin, fconv_checkpoint, tmp_path, form, task):
    """With fairseq's own task too: the plugin checks every checkpoint fairseq's loader reads."""
    path = poisoned(fconv_checkpoint, tmp_path, form)
    output = run("fairseq-generate", data_bin, "--user-dir", fairseq_convs2s_ext.__path__[0], "--path", path,
                 "--gen-subset", "test", "--beam", "2", *task, cwd=tmp_path, check=False)
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


@pytest.mark.parametrize("form", ["cfg", "dict"])
def test_python_api_averaging_and_import_refuse_it(data_bin, fconv_checkpoint, tmp_path, monkeypatch, form):
    """The plugin's hub, fairseq's own hub, averaging and convs2s-import-fconv: nothing runs,
    nothing is written, and averaging never copies a payload on."""
    from fairseq.models.fconv import FConvModel

    from fairseq_convs2s_ext import ConvS2SModel
    from fairseq_convs2s_ext.cli import average_checkpoints, import_fconv

    monkeypatch.chdir(tmp_path)
    path = poisoned(fconv_checkpoint, tmp_path, form)
    for hub in (FConvModel, ConvS2SModel):
        with pytest.raises(CheckpointRefused, match=rf"{re.escape(str(path))}: \S*encoder_layers = .* is refused"):
            hub.from_pretrained(str(tmp_path), checkpoint_file=path.name, data_name_or_path=str(data_bin))
    assert import_fconv.main([str(path), str(tmp_path / "out.pt"), "--source-dict", str(data_bin / "dict.en.txt"),
                              "--target-dict", str(data_bin / "dict.de.txt")]) == 1
    assert average_checkpoints.main(["--inputs", str(path), str(fconv_checkpoint),
                                     "--output", str(tmp_path / "avg.pt")]) != 0
    assert not (tmp_path / "PWNED").exists() and not (tmp_path / "out.pt").exists()
    assert not (tmp_path / "avg.pt").exists()


@pytest.mark.parametrize("arch, field", [("fconv_self_att", "self_attention"), ("fconv_self_att", "pretrained"),
                                         ("fconv_lm", "decoder_layers"), ("fconv_lm", "adaptive_softmax_cutoff")])
def test_other_families_that_fairseq_evaluates(tmp_path, monkeypatch, arch, field):
    """Any option of a stored Namespace is checked as the file is read, in args and in cfg."""
    monkeypatch.chdir(tmp_path)
    for state in ({"args": argparse.Namespace(arch=arch, **{field: PAYLOAD}), "model": {}},
                  {"cfg": {"model": argparse.Namespace(_name=arch, **{field: PAYLOAD})}, "model": {}}):
        torch.save(state, tmp_path / "evil.pt")
        with pytest.raises(CheckpointRefused, match=rf"evil\.pt: .*{field} = .* is refused"):
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
                                  "/home/me/my data/bin", "{'beam': 4}", "relu", "", "~/data", "None", "1e-05",
                                  "checkpoints/checkpoint_best.pt", "de-en,fr-en", "${common.seed}", "@@ "])
def test_real_options_are_values(text):
    assert checked(text, "any_option") == text


@pytest.mark.parametrize("text", ["[(512, 3)] * 20", "[(512, 3)] * 10 + [(768, 3)] * 3 + [(2048, 1)] * 2", "True",
                                  "[True, False]", "(0.9, 0.98)", "10000,50000,200000", "None", "3 * [(8, 3)]"])
def test_specifications_fairseq_evaluates_become_literals(text):
    assert ast.literal_eval(checked(text, "encoder_layers")) == eval(text)


def test_an_accepted_specification_reaches_fairseq_as_its_expanded_literal(tmp_path):
    """fairseq's eval only ever reads a literal: the repetition is expanded as the file is read."""
    history = [{"criterion_name": "CrossEntropyCriterion", "optimizer_name": "NAG",
                "lr_scheduler_state": {"best": 1.5}, "num_updates": 10}]
    torch.save({"args": argparse.Namespace(arch="fconv", encoder_layers="[(32, 3)] * 3 + [(64, 3)]"), "model": {},
                "optimizer_history": history, "extra_state": {}}, tmp_path / "a.pt")
    state = checkpoint_utils.load_checkpoint_to_cpu(str(tmp_path / "a.pt"))
    assert state["cfg"].model.encoder_layers == "[(32, 3), (32, 3), (32, 3), (64, 3)]"


@pytest.mark.parametrize("text", [
    "__import__('os').system('x')", "().__class__.__base__", "[x for x in y]", "lambda: 0", "9 ** 9 ** 9",
    "[0] * 100000 * 100000", "f'{x}'",
    # the bypasses of the repetition limit the deny-list had: arithmetic in the count
    "[0] * -(-50000000)", "[0] * (1000000 + 1000000)", "[0] * 50000000", "[[0] * 10000] * 10000", "'a' * 10 ** 9",
    "[0] * True * 99999999", "x[0]", "a if b else c", "'%999999999s' % 1", "[1, 2][::-1]",
])
def test_anything_else_is_refused(text):
    for key in ("encoder_layers", "any_option"):
        with pytest.raises(ValueError):
            checked(text, key)
    with pytest.raises(ValueError):
        parse_layers(text)  # the plugin's own model reads the same grammar


def test_the_bypasses_are_refused_where_the_plugin_builds_models(small_bin, tmp_path):
    """The repetition limit's bypasses allocated hundreds of MB through convs2s_translation."""
    from fairseq import tasks
    from omegaconf import OmegaConf

    task = tasks.setup_task(OmegaConf.create({"_name": "convs2s_translation", "data": str(small_bin),
                                              "source_lang": "en", "target_lang": "de"}))
    for spec in ("[(8, 3)] * -(-50000000)", "[(8, 3)] * (1000000 + 1000000)"):
        tracemalloc.start()
        with pytest.raises(CheckpointRefused, match=r"model\.encoder_layers"):
            task.build_model(OmegaConf.create({"_name": "convs2s_tiny", "arch": "convs2s_tiny", "encoder_layers": spec}))
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < 10 * 2**20, f"{spec}: {peak:,} bytes allocated"


class Anything:
    """What every name evaluates to below: it counts the calls made on it and answers any
    operator with itself, so an accepted expression evaluates as fairseq's eval would, minus
    the real objects."""
    calls = 0

    def __call__(self, *args, **kwargs):
        Anything.calls += 1
        return self

    def __getattr__(self, name):
        return self

    __add__ = __radd__ = __sub__ = __rsub__ = __truediv__ = __rtruediv__ = __neg__ = __pos__ = __invert__ = \
        lambda self, *other: self


class Names(dict):
    def __missing__(self, name):
        return Anything()


_NAMES = st.sampled_from(["x", "os", "__import__", "open", "data", "en", "__class__", "system"])
_ATOMS = st.one_of(_NAMES, st.integers(-10**12, 10**12).map(str), st.sampled_from(["'a'", "1.5", "True", "None"]))


def _compose(inner):
    pair = st.tuples(inner, inner)
    return st.one_of(
        st.lists(inner, max_size=3).map(lambda xs: "[" + ", ".join(xs) + "]"),
        st.lists(inner, max_size=3).map(lambda xs: "(" + ", ".join(xs) + ("," if len(xs) == 1 else "") + ")"),
        st.tuples(inner, st.sampled_from(["+", "-", "*", "/", "**", "%", "<<", "@", "//", "==", " and ", " or "]),
                  inner).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
        st.tuples(inner, st.lists(inner, max_size=2)).map(lambda t: f"{t[0]}({', '.join(t[1])})"),
        st.tuples(inner, _NAMES).map(lambda t: f"{t[0]}.{t[1]}"),
        pair.map(lambda t: f"{t[0]}[{t[1]}]"),
        pair.map(lambda t: f"[{t[0]} for x in {t[1]}]"),
        inner.map(lambda t: f"lambda: {t}"),
        inner.map(lambda t: f"-{t}"),
        inner.map(lambda t: f"f'{{{t}}}'"),
    )


EXPRESSIONS = st.recursive(_ATOMS, _compose, max_leaves=12)


KEYS = st.sampled_from(["encoder_layers", "adam_betas", "data", "any_option"])


@settings(max_examples=300, deadline=None, derandomize=True)
@given(text=EXPRESSIONS, key=KEYS)
def test_no_accepted_string_runs_code_or_grows(text, key):
    """Generated hostile expressions: whatever the allow-list accepts, fairseq's eval of it
    calls nothing and allocates little; under a key fairseq evaluates, it is a literal."""
    assert_harmless(text, key)


@pytest.mark.slow
@settings(max_examples=20_000, deadline=None)
@given(text=EXPRESSIONS, key=KEYS)
def test_many_more_hostile_strings(text, key):
    assert_harmless(text, key)


def assert_harmless(text, key):
    try:
        accepted = checked(text, key)
    except ValueError:
        return
    try:
        code = compile(accepted, "<config>", "eval")
    except SyntaxError:
        return  # fairseq's eval would fail before running anything
    if key in EVALUATED:
        ast.literal_eval(accepted)  # a literal, or it raises
    Anything.calls = 0
    tracemalloc.start()
    try:
        eval(code, {"__builtins__": {}}, Names())
    except (TypeError, AttributeError, ZeroDivisionError, ValueError, OverflowError):
        pass  # evaluation that fails before anything runs
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert Anything.calls == 0, accepted
    assert peak < 10 * 2**20, (accepted, peak)


def test_every_option_fairseq_evaluates_is_held_to_the_literal_grammar():
    """Read the installed fairseq: an option it passes to eval (or eval_str_list, eval_str_dict,
    eval_bool) that EVALUATED lacks would only get the looser rule for names and paths."""
    root = pathlib.Path(fairseq.__file__).parent
    call = re.compile(r"\b(?:eval|eval_str_list|eval_str_dict|eval_bool)\(\s*[\w.]*?(?:args|cfg|config)\.(\w+)")
    evaluated = {m[1]: path for path in root.rglob("*.py") for m in call.finditer(path.read_text(errors="replace"))}
    assert "encoder_layers" in evaluated and "adam_betas" in evaluated  # the pattern finds them
    assert {key: str(path) for key, path in evaluated.items() if key not in EVALUATED} == {}


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
    why = "cut short or damaged" if damage == "truncated" else "not a readable checkpoint"
    assert f"fairseq-generate: error: {path}: {why}" in output.stdout, output.stdout[-3000:]
    assert "Traceback" not in output.stdout
