"""``--autocast-bf16`` of the convs2s_translation task: bf16 matrix multiplies, fp32 weights,
gradients and loss, where a probe measured bf16 faster than fp32 (fairseq_convs2s_ext.hardware).

The decision is tested with figures written into the probe's cache (the path the task reads),
so that no test depends on this machine being fast or slow at bf16; the real probe is tested
to run and cache its figures."""
import json
import logging

import pytest
import torch
from fairseq.optim.nag import FairseqNAG, FairseqNAGConfig

from fairseq_convs2s_ext import hardware
from fairseq_convs2s_ext.criterions import ConvS2SCrossEntropyCriterion
from fairseq_convs2s_ext.hardware import Bf16OptionError, Bf16UnsupportedError, bf16_mode, decide_bf16
from fairseq_convs2s_ext.tasks.convs2s_translation import ConvS2STranslationConfig, ConvS2STranslationTask
from model_helpers import build, random_tokens

SLOWER = {"fp32": 65.0, "bf16": 39.0}  # the Intel Xeon of issue 33 (AVX512_BF16, no AMX), torch.mm
FASTER = {"fp32": 65.0, "bf16": 180.0}


@pytest.fixture
def cache_file(tmp_path, monkeypatch):
    """The probe's cache in a fresh folder (XDG_CACHE_HOME), as the task finds it."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path / "convs2s" / "bf16-probe.json"


def cache(cache_file, model, figures):
    """Figures for ``model``'s sizes on this machine, as measured_bf16 keys them."""
    cache_file.parent.mkdir(parents=True, exist_ok=True)
    cache_file.write_text(json.dumps({hardware.probe_key(hardware.model_shapes(model)): figures}))


def sample(d):
    target = random_tokens(d, 3, 6)
    return {"net_input": {"src_tokens": random_tokens(d, 3, 5), "src_lengths": torch.full((3,), 5),
                          "prev_output_tokens": torch.roll(target, 1, 1)},
            "target": target, "ntokens": target.numel()}


def run_steps(autocast, figures=None, cache_file=None):
    torch.manual_seed(0)
    model, d = build()
    if figures is not None:
        cache(cache_file, model, figures)
    task = ConvS2STranslationTask(ConvS2STranslationConfig(autocast_bf16=autocast, replace_unk=None), d, d)
    criterion = ConvS2SCrossEntropyCriterion(task, 0.1)
    optimizer = FairseqNAG(FairseqNAGConfig(lr=[0.25]), list(model.parameters()))
    dtypes = []
    model.decoder.output_projection.register_forward_hook(lambda m, i, out: dtypes.append(out.dtype))
    s = sample(d)
    loss, _, _ = task.train_step(s, model, criterion, optimizer, update_num=0)
    grads = {p.grad.dtype for p in model.parameters() if p.grad is not None}
    valid_loss, _, _ = task.valid_step(s, model, criterion)
    return dtypes, loss, grads, valid_loss


def test_the_decision_follows_the_measured_figures():
    assert decide_bf16(FASTER)[0] and not decide_bf16(SLOWER)[0]
    assert not decide_bf16({"fp32": 100.0, "bf16": 105.0})[0]  # within the margin: fp32 keeps its precision
    faster, why = decide_bf16(SLOWER)
    assert "ran at 39 GFLOP/s against 65 in fp32 on this CPU" in why and "is not at least 1.1x faster" in why
    assert [bf16_mode(v) for v in (True, False, "True", "false", None, "on", "auto", "off")] == \
        ["on", "off", "on", "off", "off", "on", "auto", "off"]
    with pytest.raises(Bf16OptionError, match="on, off or auto"):
        bf16_mode("data/bin")


def test_autocast_bf16_runs_the_model_in_bf16_where_measured_faster(cache_file):
    dtypes, loss, grads, valid_loss = run_steps("on", FASTER, cache_file)
    assert dtypes == [torch.bfloat16, torch.bfloat16]  # train_step, valid_step
    assert loss.dtype == valid_loss.dtype == torch.float32 and grads == {torch.float32}
    fp32_dtypes, fp32_loss, _, _ = run_steps("off")
    assert fp32_dtypes == [torch.float32, torch.float32]
    assert abs(loss.item() - fp32_loss.item()) < 0.02 * fp32_loss.item()


def test_autocast_bf16_is_refused_with_the_figures_where_measured_slower(cache_file):
    with pytest.raises(Bf16UnsupportedError, match=r"ran at 39 GFLOP/s against 65 in fp32 on this CPU .*"
                                                   r"run without --autocast-bf16 \(fp32\), or with --autocast-bf16 auto"):
        run_steps(True, SLOWER, cache_file)


@pytest.mark.parametrize("figures, dtype", [(SLOWER, torch.float32), (FASTER, torch.bfloat16)], ids=["slower", "faster"])
def test_auto_takes_the_faster_and_says_why(cache_file, caplog, figures, dtype):
    with caplog.at_level(logging.INFO, logger="fairseq_convs2s_ext.hardware"):
        dtypes, _, _, _ = run_steps("auto", figures, cache_file)
    assert dtypes == [dtype, dtype]
    choice = [r.getMessage() for r in caplog.records if r.name == "fairseq_convs2s_ext.hardware"]
    name = "bf16" if dtype is torch.bfloat16 else "fp32"
    assert len(choice) == 1 and choice[0].startswith(f"--autocast-bf16 auto: {name}, because bf16 matrix multiplies")


def test_the_probe_takes_each_dtypes_fastest_round(monkeypatch):
    """The figures are cached for good: a round that other work slowed (here the first fp32
    one, made a hundred times slower) must not decide. Each dtype is timed more than once,
    in turn with the other, and its fastest round counts."""
    real, rounds = hardware._gflops, {"fp32": [], "bf16": []}

    def timed(a, b, dtype):
        name = "bf16" if dtype is torch.bfloat16 else "fp32"
        value = real(a, b, dtype) / (100 if name == "fp32" and not rounds["fp32"] else 1)
        rounds[name].append(value)
        return value

    monkeypatch.setattr(hardware, "_gflops", timed)
    figures = hardware.probe_bf16([(64, 64)])

    assert len(rounds["fp32"]) == len(rounds["bf16"]) > 1
    assert figures == {name: round(max(values), 2) for name, values in rounds.items()}


def test_the_real_probe_measures_and_caches(cache_file, monkeypatch):
    model, _ = build()
    figures = hardware.measured_bf16(hardware.model_shapes(model))
    assert figures["fp32"] > 0 and figures["bf16"] > 0
    assert list(json.loads(cache_file.read_text()).values()) == [figures]
    assert not list(cache_file.parent.glob("*.tmp"))  # written atomically
    monkeypatch.setattr(hardware, "probe_bf16", lambda shapes: pytest.fail("measured again"))
    assert hardware.measured_bf16(hardware.model_shapes(model)) == figures  # from the cache
