"""fairseq fconv checkpoints imported into convs2s compute the same translations.

fconv models are built through fairseq's real registry and translation task, saved as
fairseq checkpoints (the structure fairseq's trainer writes, and the older argparse one),
read back by fairseq's own loader, imported with ``convs2s-import-fconv``, and compared:
log-probabilities in full and incremental mode (with a beam reorder), and beam search.
"""
import argparse
import os

import pytest
import torch
from fairseq import checkpoint_utils
from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY
from fairseq.sequence_generator import SequenceGenerator
from fairseq.tasks.translation import TranslationConfig, TranslationTask

from fairseq_convs2s_ext.checkpoints.fconv_import import convert_checkpoint
from fairseq_convs2s_ext.cli import import_fconv
from fairseq_convs2s_ext.models import ConvS2SModel
from fairseq_convs2s_ext.modules import parse_layers
from model_helpers import dictionary, random_tokens

MAX_POSITIONS = 64
ARCHS = {
    "iwslt": dict(arch="fconv_iwslt_de_en", encoder_layers="[(16, 3)] * 3", decoder_layers="[(16, 3)] * 2",
                  encoder_embed_dim=16, decoder_embed_dim=16, decoder_out_embed_dim=16),
    # Widths that change (residual projections), kernel width 1, as the WMT'14 models.
    "wmt_en_de_like": dict(arch="fconv_wmt_en_de", encoder_layers="[(16, 3)] * 2 + [(32, 3)] + [(48, 1)] * 2",
                           decoder_layers="[(16, 3)] * 2 + [(32, 3)] + [(48, 1)] * 2",
                           encoder_embed_dim=24, decoder_embed_dim=24, decoder_out_embed_dim=12),
    # Even kernel widths, attention on a subset of the layers.
    "attention_subset": dict(arch="fconv", encoder_layers="[(16, 2), (24, 4), (24, 1)]",
                             decoder_layers="[(16, 2), (24, 3), (24, 1), (16, 4)]",
                             decoder_attention="[True, False, False, True]",
                             encoder_embed_dim=20, decoder_embed_dim=20, decoder_out_embed_dim=12),
    "shared_output_embed": dict(arch="fconv_wmt_en_fr", encoder_layers="[(16, 3), (32, 1)]",
                                decoder_layers="[(16, 3), (16, 3), (32, 1)]", encoder_embed_dim=16,
                                decoder_embed_dim=16, decoder_out_embed_dim=16, share_input_output_embed=True),
}


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


def build_fconv(arch, vocab=40, **overrides):
    d = dictionary(vocab)
    task = TranslationTask(TranslationConfig(), d, d)
    args = argparse.Namespace(arch=arch, _name=arch, max_source_positions=MAX_POSITIONS,
                              max_target_positions=MAX_POSITIONS, **overrides)
    ARCH_CONFIG_REGISTRY[arch](args)
    model = ARCH_MODEL_REGISTRY[arch].build_model(args, task)
    with torch.no_grad():  # non-zero biases, so a misplaced one shows
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.1)
    return model, args, task


def trainer_checkpoint(model, args):
    """The structure fairseq's Trainer.state_dict writes (fairseq >= 0.10)."""
    return {
        "args": None,
        "cfg": {"model": args, "task": {"_name": "translation"}},
        "model": model.state_dict(),
        "criterion": None,
        "optimizer_history": [{"criterion_name": "LabelSmoothedCrossEntropyCriterion", "optimizer_name": "FairseqNAG",
                               "lr_scheduler_state": {"best": 3.5}, "num_updates": 100}],
        "task_state": {},
        "extra_state": {"metrics": {}, "previous_training_time": 1.0, "train_iterator": {"epoch": 2}},
        "last_optimizer_state": {"state": {0: {"momentum_buffer": torch.zeros(3)}}, "param_groups": []},
    }


def argparse_checkpoint(model, args):
    """The older layout of the released models: an argparse Namespace in 'args'."""
    return {
        "args": args,
        "model": model.state_dict(),
        "optimizer_history": [{"criterion_name": "CrossEntropyCriterion", "optimizer_name": "FairseqNAG",
                               "lr_scheduler_state": {"best": 2.1}, "num_updates": 5000}],
        "extra_state": {"epoch": 40, "batch_offset": 0, "val_loss": 2.1, "train_iterator": {"epoch": 40}},
        "last_optimizer_state": {"state": {}, "param_groups": []},
    }


def dictionary_options(tmp_path, task):
    """--source-dict/--target-dict for the dictionaries of ``task``, saved in tmp_path."""
    paths = []
    for lang, d in (("src", task.source_dictionary), ("tgt", task.target_dictionary)):
        paths.append(tmp_path / f"dict.{lang}.txt")
        d.save(str(paths[-1]))
    return ["--source-dict", str(paths[0]), "--target-dict", str(paths[1])]


def save_and_import(tmp_path, state, task):
    """Save a fairseq checkpoint, load it with fairseq, import it, load the result with fairseq."""
    fconv_path, ours_path = str(tmp_path / "fconv.pt"), str(tmp_path / "convs2s.pt")
    checkpoint_utils.torch_persistent_save(state, fconv_path)
    assert import_fconv.main([fconv_path, ours_path, *dictionary_options(tmp_path, task)]) == 0
    # no temporary file left behind
    assert sorted(os.listdir(tmp_path)) == ["convs2s.pt", "dict.src.txt", "dict.tgt.txt", "fconv.pt"]
    (fconv,), _, _ = checkpoint_utils.load_model_ensemble_and_task([fconv_path], task=task)
    (ours,), _, _ = checkpoint_utils.load_model_ensemble_and_task([ours_path], task=task)
    assert isinstance(ours, ConvS2SModel)
    return fconv.eval(), ours.eval()


def batch(d, batch_size=4, src_len=7, tgt_len=9):
    src, tgt = random_tokens(d, batch_size, src_len), random_tokens(d, batch_size, tgt_len)
    src[1, :3] = d.pad()  # left-padded source, as fairseq batches it
    src[:, -1] = d.eos()
    tgt[:, 0] = d.eos()
    return src, src.ne(d.pad()).sum(1), tgt


def log_probs(model, net_output):
    return model.get_normalized_probs(net_output, log_probs=True)


def incremental_log_probs(model, src, src_lengths, tgt, reorder_at, new_order):
    """One step at a time; at `reorder_at` the beam is reordered: row r continues row new_order[r]."""
    after = torch.cat([tgt[new_order, :reorder_at], tgt[:, reorder_at:]], 1)
    encoder_out = model.encoder(src, src_lengths)
    state, steps = {}, []
    for t in range(tgt.size(1)):
        if t == reorder_at:
            model.decoder.reorder_incremental_state_scripting(state, new_order)
            encoder_out = model.encoder.reorder_encoder_out(encoder_out, new_order)
        prefix = (tgt if t < reorder_at else after)[:, : t + 1]
        steps.append(log_probs(model, model.decoder(prefix, encoder_out, incremental_state=state)))
    return torch.cat(steps, 1), after


def assert_same_function(fconv, ours, d):
    src, src_lengths, tgt = batch(d)
    with torch.no_grad():
        expected = log_probs(fconv, fconv(src, src_lengths, tgt))
        torch.testing.assert_close(log_probs(ours, ours(src, src_lengths, tgt)), expected, atol=1e-5, rtol=0)
        new_order = torch.tensor([2, 2, 0, 3])
        (fconv_steps, after), (our_steps, _) = [
            incremental_log_probs(m, src, src_lengths, tgt, 4, new_order) for m in (fconv, ours)
        ]
        full = log_probs(fconv, fconv(src[new_order], src_lengths[new_order], after))
    torch.testing.assert_close(our_steps, fconv_steps, atol=1e-5, rtol=0)
    torch.testing.assert_close(our_steps[:, :4], expected[:, :4], atol=1e-5, rtol=0)
    torch.testing.assert_close(our_steps[:, 4:], full[:, 4:], atol=1e-5, rtol=0)
    assert_same_beam_search(fconv, ours, d)


def assert_same_beam_search(fconv, ours, d):
    src, src_lengths, _ = batch(d, batch_size=3)
    sample = {"net_input": {"src_tokens": src, "src_lengths": src_lengths}}
    results = []
    for model in (fconv, ours):
        generator = SequenceGenerator([model], d, beam_size=5, max_len_b=12)
        results.append(generator.generate([model], sample))
    for fconv_hypos, our_hypos in zip(*results):
        assert len(fconv_hypos) == len(our_hypos) == 5
        for a, b in zip(fconv_hypos, our_hypos):
            assert torch.equal(a["tokens"], b["tokens"])
            torch.testing.assert_close(b["positional_scores"], a["positional_scores"], atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", ARCHS)
def test_imported_fconv_gives_the_same_log_probs_and_beam_search(tmp_path, name):
    model, args, task = build_fconv(**ARCHS[name])
    fconv, ours = save_and_import(tmp_path, trainer_checkpoint(model, args), task)
    assert_same_function(fconv, ours, task.target_dictionary)
    # Generation's inference mode (weight norm folded away, fconv's BeamableMM) changes nothing.
    for m in (fconv, ours):
        m.make_generation_fast_(beamable_mm_beam_size=5)
    assert_same_beam_search(fconv, ours, task.target_dictionary)


def test_old_argparse_checkpoint_with_version_1_decoder_convolutions(tmp_path):
    """Released models predate decoder version 2: weight norm over the kernel dimension. One
    layer is stored without weight norm, as after make_generation_fast_."""
    model, args, task = build_fconv(**ARCHS["wmt_en_de_like"])
    for i, conv in enumerate(model.decoder.convolutions):
        torch.nn.utils.remove_weight_norm(conv)
        model.decoder.convolutions[i] = torch.nn.utils.weight_norm(conv, dim=0)
    torch.nn.utils.remove_weight_norm(model.encoder.fc2)
    state = argparse_checkpoint(model, args)
    del state["model"]["decoder.version"]
    assert state["model"]["decoder.convolutions.0.weight_g"].shape == (3, 1, 1)
    fconv_path, ours_path = tmp_path / "fconv.pt", tmp_path / "convs2s.pt"
    torch.save(state, fconv_path)
    assert import_fconv.main([str(fconv_path), str(ours_path), *dictionary_options(tmp_path, task)]) == 0
    (ours,), _, _ = checkpoint_utils.load_model_ensemble_and_task([str(ours_path)], task=task)
    assert torch.load(ours_path, weights_only=True)["args"].arch == "convs2s"
    assert_same_function(model.eval(), ours.eval(), task.target_dictionary)


@pytest.mark.parametrize("arch, embed_dim, widths", [
    ("fconv_wmt_en_de", 768, [512] * 9 + [1024] * 4 + [2048] * 2),
    ("fconv_wmt_en_fr", 768, [512] * 6 + [768] * 4 + [1024] * 3 + [2048, 4096]),
    ("fconv_wmt_en_ro", 512, [512] * 20),
])
def test_released_architectures_map_onto_convs2s(arch, embed_dim, widths):
    """The full-size WMT layouts (768-dim embeddings, up to 4096 units, kernel width 1): every
    tensor finds its place with the right shape. Built on the meta device, so no memory."""
    with torch.device("meta"):
        model, args, task = build_fconv(arch, vocab=100)
    d = task.source_dictionary
    state = convert_checkpoint(argparse_checkpoint(model, args), d, d, "meta.pt")
    assert state["args"].arch == "convs2s" and state["args"].encoder_embed_dim == embed_dim
    assert [w for w, _ in parse_layers(state["args"].decoder_layers)] == widths
    assert state["args"].max_source_positions == MAX_POSITIONS - 2  # the same usable length as fconv
    assert state["last_optimizer_state"] is None
    assert not hasattr(state["args"], "encoder_embed_path")


def test_errors_name_the_file(tmp_path, capsys):
    model, args, task = build_fconv(**ARCHS["iwslt"])
    dictionaries = dictionary_options(tmp_path, task)

    def error(state_or_bytes):
        path = tmp_path / "in.pt"
        if isinstance(state_or_bytes, bytes):
            path.write_bytes(state_or_bytes)
        else:
            torch.save(state_or_bytes, path)
        assert import_fconv.main([str(path), str(tmp_path / "out.pt"), *dictionaries]) == 1
        assert not (tmp_path / "out.pt").exists()
        assert sorted(os.listdir(tmp_path)) == ["dict.src.txt", "dict.tgt.txt", "in.pt"]
        message = capsys.readouterr().err
        assert str(path) in message
        return message

    assert "not a PyTorch checkpoint" in error(b"just some text\n")
    good = trainer_checkpoint(model, args)
    torch.save(good, tmp_path / "good.pt")
    truncated = (tmp_path / "good.pt").read_bytes()[:5000]
    os.remove(tmp_path / "good.pt")
    assert "cut short" in error(truncated)
    assert "bzip2" in error(b"BZh91AY&SY" + bytes(100))
    assert "not a fairseq checkpoint" in error({"weights": torch.zeros(2)})
    assert "not an fconv checkpoint" in error(dict(good, cfg={"model": argparse.Namespace(arch="transformer")}))
    assert "safe unpickler" in error(dict(good, extra=argparse.ArgumentParser))
    with_adaptive = dict(good, model=dict(good["model"], **{"decoder.adaptive_softmax.head.weight": torch.zeros(1)}))
    assert "adaptive softmax" in error(with_adaptive)
    # fconv's (channels, kernel, residual) with a residual connection two layers back.
    skip_args = argparse.Namespace(**dict(vars(args), encoder_layers="[(16, 3, 1), (16, 3, 2), (16, 3)]"))
    assert "residual connections" in error(dict(good, cfg={"model": skip_args}))
    # Weights that contradict the configuration.
    assert "do not match" in error(dict(good, cfg={"model": argparse.Namespace(**dict(vars(args), encoder_embed_dim=8))}))
    assert import_fconv.main([str(tmp_path / "missing.pt"), str(tmp_path / "o.pt")]) == 1
    assert f"{tmp_path / 'missing.pt'}: no such file" in capsys.readouterr().err
