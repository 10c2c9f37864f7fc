"""The model's dataclass config: fairseq-hydra-train with the recipes' YAML, hydra overrides
without ``+``, the architectures as named defaults, and the old command line and checkpoints."""
import argparse
import subprocess
import sys

import pytest
import torch
from fairseq import checkpoint_utils, options
from fairseq.dataclass.initialize import add_defaults
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.models import build_model
from omegaconf import OmegaConf

import fairseq_convs2s_ext  # noqa: F401  (registers the model)
from cli_helpers import run, write_lines
from conftest import ROOT
from convs2s_recipes.settings import CONFIG_DIR
from fairseq_convs2s_ext.modules import parse_layers
from model_helpers import build, dictionary

EN_DE = [(512, 3)] * 10 + [(768, 3)] * 3 + [(2048, 1)] * 2


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory, data_dir):
    """300 training and 50 validation sentences of Multi30k en-de, binarized by fairseq-preprocess."""
    work = tmp_path_factory.mktemp("multi30k-hydra")
    for split, name, count in (("train", "train", 300), ("valid", "val", 50)):
        for lang in ("en", "de"):
            lines = (data_dir / "multi30k" / f"{name}.{lang}").read_text(encoding="utf-8").splitlines()[:count]
            write_lines(work / f"{split}.{lang}", lines)
    run("fairseq-preprocess", "--source-lang", "en", "--target-lang", "de", "--trainpref", work / "train",
        "--validpref", work / "valid", "--destdir", work / "bin", "--joined-dictionary", "--workers", "1")
    return work / "bin"


def test_fairseq_hydra_train_takes_model_overrides_without_plus(data_bin, tmp_path):
    """The documented command, from a folder of its own: the recipe's architecture replaced by
    another (model=ARCH) and one of its options overridden (no `+`); hydra writes nothing into
    the working folder, and opens without its deprecation warnings about schema matching and
    the working-directory change."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    log = run("fairseq-hydra-train", "--config-dir", CONFIG_DIR, "--config-name", "recipe/multi30k_demo",
              f"task.data={data_bin}", "checkpoint.save_dir=checkpoints", "model=convs2s_tiny",
              "model.encoder_layers='[(48, 3)] * 3'", "optimization.max_update=2", "dataset.max_tokens=500",
              cwd=cwd)
    assert "num_updates 2" in log, log[-3000:]
    assert "ConfigStore schema" not in log and "working directory" not in log, log[:3000]
    assert sorted(p.name for p in cwd.iterdir()) == ["checkpoints"]  # no outputs/DATE/TIME
    state = torch.load(cwd / "checkpoints" / "checkpoint_last.pt", map_location="cpu")
    model_cfg = state["cfg"]["model"]
    assert model_cfg["_name"] == "convs2s_tiny"
    assert model_cfg["encoder_layers"] == "[(48, 3)] * 3" and model_cfg["decoder_layers"] == "[(32, 3)] * 2"
    assert state["cfg"]["common"]["user_dir"] == str(ROOT / "fairseq_convs2s_ext")
    assert state["model"]["encoder.convolutions.2.linear.parametrizations.weight.original1"].shape == (96, 3 * 48)
    # fairseq's own loader builds the same model from the saved config.
    models, _ = checkpoint_utils.load_model_ensemble([str(cwd / "checkpoints" / "checkpoint_last.pt")])
    assert len(models[0].encoder.convolutions) == 3


def _compose(*overrides):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.1"):
        cfg = compose("recipe/wmt14_en_de", ["task.data=unused", *overrides])
    add_defaults(cfg)
    return cfg


def test_recipe_configs_name_their_architecture():
    cfg = _compose("model.dropout=0.3")
    assert cfg.model._name == "convs2s_wmt_en_de"
    assert parse_layers(cfg.model.encoder_layers) == EN_DE and cfg.model.dropout == 0.3
    assert cfg.common.user_dir == str(ROOT / "fairseq_convs2s_ext")
    other = _compose("model=convs2s_gigaword", "model.decoder_layers='[(64, 5)]'")
    assert parse_layers(other.model.encoder_layers) == [(256, 3)] * 6
    assert parse_layers(other.model.decoder_layers) == [(64, 5)]


def test_a_config_that_only_names_the_architecture_gets_its_layers():
    """fairseq fills a hydra model config from the model's dataclass before the architecture
    runs; the dataclass leaves the options unset, so the architecture still decides."""
    cfg = OmegaConf.create({"task": {"_name": "translation", "max_source_positions": 64,
                                     "max_target_positions": 64},
                            "model": {"_name": "convs2s_gigaword", "encoder_embed_dim": 128}})
    add_defaults(cfg)
    d = dictionary()
    task = argparse.Namespace(source_dictionary=d, target_dictionary=d)
    with torch.device("meta"):
        model = build_model(cfg.model, task)
    assert [c.linear.out_features // 2 for c in model.encoder.convolutions] == [256] * 6
    assert model.encoder.embed.tokens.embedding_dim == 128


def test_command_line_options_override_the_architecture():
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [
        "unused-data", "--user-dir", str(ROOT / "fairseq_convs2s_ext"), "--arch", "convs2s_wmt_en_de",
        "--encoder-layers", "[(16, 3)] * 2", "--decoder-attention", "[True] * 14 + [False]",
    ])
    cfg = convert_namespace_to_omegaconf(args)
    assert cfg.model._name == "convs2s_wmt_en_de"
    assert parse_layers(cfg.model.encoder_layers) == [(16, 3)] * 2
    assert parse_layers(cfg.model.decoder_layers) == EN_DE
    assert cfg.model.decoder_attention == "[True] * 14 + [False]"


def test_checkpoint_with_the_old_argparse_model_config_loads(tmp_path):
    """Checkpoints written before the dataclass keep the model's options as an argparse
    Namespace in cfg.model (and older ones in args); both load into the same model."""
    model, d = build(max_positions=64)
    options_ = dict(arch="convs2s_tiny", _name="convs2s_tiny", dropout=0.1, encoder_embed_dim=32,
                    encoder_layers="[(32, 3)] * 2", decoder_embed_dim=32, decoder_layers="[(32, 3)] * 2",
                    decoder_out_embed_dim=32, decoder_attention="True", share_input_output_embed=False,
                    max_source_positions=64, max_target_positions=64)
    history = [{"criterion_name": "CrossEntropyCriterion", "optimizer_name": "NAG",
                "lr_scheduler_state": {"best": 1.5}, "num_updates": 10}]
    common = {"model": model.state_dict(), "optimizer_history": history, "extra_state": {}}
    task = argparse.Namespace(source_dictionary=d, target_dictionary=d)
    for name, config in (("cfg", {"cfg": {"model": argparse.Namespace(**options_)}}),
                         ("args", {"args": argparse.Namespace(task="translation", **options_)})):
        path = tmp_path / f"{name}.pt"
        torch.save({**common, **config}, path)
        state = checkpoint_utils.load_checkpoint_to_cpu(str(path))
        loaded = build_model(state["cfg"].model, task)
        loaded.load_state_dict(state["model"])
        for key, value in model.state_dict().items():
            assert torch.equal(loaded.state_dict()[key], value), (name, key)


def test_recipe_training_shows_no_hydra_deprecation_warnings_and_logs_to_tensorboard(data_bin, tmp_path):
    """What `make demo` prints while it trains: fairseq's progress, without hydra's pages of
    deprecation warnings (version_base, schema matching, working-directory change) or
    fairseq's "Please install tensorboardX"; --tensorboard-logdir works."""
    overrides = ["model=convs2s_tiny", "optimization.max_update=2", "dataset.max_tokens=500",
                 f"common.tensorboard_logdir={tmp_path / 'tensorboard'}"]
    code = ("import logging, sys\nfrom convs2s_recipes import run\nlogging.basicConfig(level=logging.INFO)\n"
            f"run.train(run.RECIPES['multi30k-demo'], {str(data_bin)!r}, {str(tmp_path)!r}, {overrides!r})")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, text=True, capture_output=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = proc.stdout + proc.stderr
    assert "num_updates 2" in log
    for noise in ("version_base", "ConfigStore schema", "working directory", "Please install tensorboardX"):
        assert noise not in log, noise
    assert (tmp_path / "checkpoints" / "checkpoint_last.pt").exists()
    assert list((tmp_path / "tensorboard" / "train").glob("events.out.tfevents.*"))
