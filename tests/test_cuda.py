"""On a GPU: the model, the losses, generation's choice of step, fp16 and --compile.

Run by ``make gpu-check`` (``pytest -m cuda``); skipped where torch sees no CUDA device.
"""
import pytest
import torch
from fairseq import utils
from fairseq.sequence_generator import SequenceGenerator
from fairseq.tasks.translation import TranslationConfig, TranslationTask

from fairseq_convs2s_ext.criterions import ConvS2SCrossEntropyCriterion
from fairseq_convs2s_ext.generation import LeanSequenceGenerator
from fairseq_convs2s_ext.tasks.convs2s_translation import ConvS2STranslationConfig, ConvS2STranslationTask
from model_helpers import build, random_tokens
from test_compile import batch, train
from test_criterion import assert_implementations_agree, both_implementations

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]
PAD = 1


def test_the_model_computes_on_the_gpu_what_it_computes_on_the_cpu():
    torch.manual_seed(0)
    model, d = build(dropout=0.0)
    sample = batch(d, 6, 9, 7)
    criterion = ConvS2SCrossEntropyCriterion(TranslationTask(TranslationConfig(), d, d), 0.1)
    results = []
    for device in ("cpu", "cuda"):
        model.to(device).zero_grad(set_to_none=True)
        loss, _, _ = criterion(model, utils.apply_to_sample(lambda t: t.to(device), sample))
        loss.backward()
        # copies: on the CPU .cpu() is the gradient itself, which model.to("cuda") then moves
        results.append((loss.item(), [p.grad.to("cpu", copy=True) for p in model.parameters()]))
    (cpu_loss, cpu_grads), (gpu_loss, gpu_grads) = results
    assert gpu_loss == pytest.approx(cpu_loss, rel=1e-4)
    for (name, _), cpu_grad, gpu_grad in zip(model.named_parameters(), cpu_grads, gpu_grads):
        torch.testing.assert_close(gpu_grad, cpu_grad, rtol=1e-3, atol=1e-5, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_both_losses_agree_on_the_gpu_and_auto_takes_the_fused_one(dtype):
    outputs = both_implementations("cuda", dtype, 0, ("fused", "blockwise", "auto"))
    assert_implementations_agree(outputs, dtype)
    assert all(torch.equal(a, b) for a, b in zip(outputs["auto"], outputs["fused"]))


def test_fp16_training_step_gives_fp32_s_loss():
    torch.manual_seed(0)
    model, d = build(dropout=0.0)
    model.cuda()
    sample = utils.move_to_cuda(batch(d, 6, 9, 7))
    task = ConvS2STranslationTask(ConvS2STranslationConfig(replace_unk=None), d, d)
    criterion = ConvS2SCrossEntropyCriterion(task, 0.1)
    fp32, _, _ = criterion(model, sample)
    fp16, _, _ = criterion(model.half(), sample)
    assert fp16.dtype == torch.float32 and fp16.item() == pytest.approx(fp32.item(), rel=1e-2)
    fp16.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


def test_generation_takes_the_stock_step_on_the_gpu_with_the_lean_step_s_hypotheses():
    torch.manual_seed(0)
    model, d = build(dropout=0.0)
    model.cuda().eval()
    task = ConvS2STranslationTask(ConvS2STranslationConfig(replace_unk=None), d, d)
    assert task.beam_step([model]) == "stock"
    source = random_tokens(d, 8, 9).cuda()
    sample = {"net_input": {"src_tokens": source, "src_lengths": torch.full((8,), 9, device="cuda")}}
    stock = SequenceGenerator([model], d, beam_size=5, max_len_b=12)
    lean = LeanSequenceGenerator([model], d, beam_size=5, max_len_b=12)
    for a, b in zip(stock.generate([model], sample), lean.generate([model], sample)):
        assert [h["tokens"].tolist() for h in a] == [h["tokens"].tolist() for h in b]
        torch.testing.assert_close(torch.stack([h["score"] for h in a]), torch.stack([h["score"] for h in b]))


def test_compiled_steps_equal_eager_ones_on_the_gpu():
    """test_compile's check, with the model and batches on the GPU."""
    torch._dynamo.reset()
    torch.set_default_device("cuda")
    try:
        shapes = [(4, 7, 6), (3, 9, 8), (5, 6, 11)]
        eager, eager_valid, _, _ = train(False, shapes)
        compiled, compiled_valid, _, graphs = train(True, shapes)
    finally:
        torch.set_default_device("cpu")
    assert compiled == pytest.approx(eager, rel=1e-4) and compiled_valid == pytest.approx(eager_valid, rel=1e-4)
    assert graphs[1:] == [graphs[0]] * (len(shapes) - 1)
