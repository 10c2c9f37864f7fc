"""``--autocast-bf16`` of the convs2s_translation task: bf16 matrix multiplies, fp32 weights,
gradients and loss; refused on a CPU without native bf16."""
import pytest
import torch
from fairseq.optim.nag import FairseqNAG, FairseqNAGConfig

from fairseq_convs2s_ext.criterions import ConvS2SCrossEntropyCriterion
from fairseq_convs2s_ext.hardware import Bf16UnsupportedError, cpu_has_native_bf16
from fairseq_convs2s_ext.tasks.convs2s_translation import ConvS2STranslationConfig, ConvS2STranslationTask
from model_helpers import build, random_tokens

needs_native_bf16 = pytest.mark.skipif(
    not cpu_has_native_bf16(),
    reason=f"this CPU has no native bf16 (torch CPU capability "
           f"{torch.backends.cpu.get_cpu_capability()}): --autocast-bf16 is refused here",
)


def sample(d):
    target = random_tokens(d, 3, 6)
    return {"net_input": {"src_tokens": random_tokens(d, 3, 5), "src_lengths": torch.full((3,), 5),
                          "prev_output_tokens": torch.roll(target, 1, 1)},
            "target": target, "ntokens": target.numel()}


def run_steps(autocast):
    torch.manual_seed(0)
    model, d = build()
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


@needs_native_bf16
def test_autocast_bf16_runs_the_model_in_bf16_and_keeps_fp32_gradients_and_loss():
    dtypes, loss, grads, valid_loss = run_steps(autocast=True)
    assert dtypes == [torch.bfloat16, torch.bfloat16]  # train_step, valid_step
    assert loss.dtype == valid_loss.dtype == torch.float32 and grads == {torch.float32}
    fp32_dtypes, fp32_loss, _, _ = run_steps(autocast=False)
    assert fp32_dtypes == [torch.float32, torch.float32]
    assert abs(loss.item() - fp32_loss.item()) < 0.02 * fp32_loss.item()


def test_autocast_bf16_is_refused_on_a_cpu_without_native_bf16():
    """Emulated bf16 matrix multiplies are hundreds of times slower than fp32: the task says
    so instead of crawling. Where the CPU has native bf16, the same step runs."""
    if cpu_has_native_bf16():
        dtypes, _, _, _ = run_steps(autocast=True)
        assert dtypes == [torch.bfloat16, torch.bfloat16]
        return
    capability = torch.backends.cpu.get_cpu_capability()
    with pytest.raises(Bf16UnsupportedError, match=rf"capability {capability}\b.*without --autocast-bf16 \(fp32\)"):
        run_steps(autocast=True)
    fp32_dtypes, _, _, _ = run_steps(autocast=False)  # fp32 is never refused
    assert fp32_dtypes == [torch.float32, torch.float32]
