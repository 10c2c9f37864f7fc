"""``--compile``: training and validation steps under torch.compile give eager mode's losses
and gradients, and batches of new shapes reuse the compiled code."""
import logging

import pytest
import torch
from fairseq.optim.nag import FairseqNAG, FairseqNAGConfig

from fairseq_convs2s_ext.compilation import graphs_compiled
from fairseq_convs2s_ext.criterions import ConvS2SCrossEntropyCriterion
from fairseq_convs2s_ext.tasks.convs2s_translation import ConvS2STranslationConfig, ConvS2STranslationTask
from model_helpers import build, random_tokens

PAD = 1


def batch(d, sentences, source_length, target_length, padded=True):
    """A batch with left-padded sources and right-padded targets, as fairseq collates them."""
    source, target = random_tokens(d, sentences, source_length), random_tokens(d, sentences, target_length)
    if padded:
        source[0, :2] = PAD
        target[-1, -2:] = PAD
    prev = torch.roll(target, 1, 1)
    prev[:, 0] = d.eos()
    return {"net_input": {"src_tokens": source, "src_lengths": source.ne(PAD).sum(1),
                          "prev_output_tokens": prev},
            "target": target, "ntokens": int(target.ne(PAD).sum())}


def train(compile, batches):
    """Losses, validation losses and how far each weight moved after a training step on each
    batch."""
    torch.manual_seed(0)
    model, d = build(dropout=0.0)  # compiled dropout draws other random numbers than eager's
    initial = {n: p.detach().clone() for n, p in model.named_parameters()}
    task = ConvS2STranslationTask(ConvS2STranslationConfig(compile=compile, replace_unk=None), d, d)
    criterion = ConvS2SCrossEntropyCriterion(task, 0.1)
    optimizer = FairseqNAG(FairseqNAGConfig(lr=[0.25]), list(model.parameters()))
    torch.manual_seed(1)
    samples = [batch(d, *shape) for shape in batches]
    losses, valid_losses, graphs = [], [], []
    for sample in samples:
        optimizer.zero_grad()
        loss, sample_size, _ = task.train_step(sample, model, criterion, optimizer, update_num=0)
        optimizer.multiply_grads(1.0 / sample_size)
        optimizer.step()
        losses.append(loss.item())
        valid_losses.append(task.valid_step(sample, model, criterion)[0].item())
        graphs.append(graphs_compiled())
    return losses, valid_losses, {n: p.detach() - initial[n] for n, p in model.named_parameters()}, graphs


class Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_compiled_steps_equal_eager_ones_and_new_shapes_do_not_recompile():
    torch._dynamo.reset()
    # the first batch has as many sentences as source and target positions: torch would give the
    # three one symbol (duck shaping) and compile again at the next batch
    shapes = [(7, 7, 7), (3, 9, 8), (5, 6, 11), (4, 7, 6, False)]  # the last without padding
    eager_losses, eager_valid, eager_moves, _ = train(False, shapes)
    logger, records = logging.getLogger("fairseq_convs2s_ext.compilation"), Records()
    logger.addHandler(records)
    logger.setLevel(logging.INFO)
    try:
        losses, valid, moves, graphs = train(True, shapes)
    finally:
        logger.removeHandler(records)
    assert losses == pytest.approx(eager_losses, rel=1e-5)
    assert valid == pytest.approx(eager_valid, rel=1e-5)
    # compiled kernels add in another order: float32 rounding differs by an amount that grows with
    # the updates (1.2e-6 on one CI host after moves of 0.02), so the bound is a share of the
    # largest move of each weight; a wrong gradient moves a weight by the order of that move
    for name, move in moves.items():
        bound = 1e-3 * eager_moves[name].abs().max().item() + 1e-7
        torch.testing.assert_close(move, eager_moves[name], rtol=0, atol=bound, msg=lambda m: f"{name}: {m}")
    # the first training and validation steps compile; batches of other shapes do not
    assert graphs[0] > 0 and graphs[1:] == [graphs[0]] * (len(shapes) - 1)
    assert len(records.messages) == 2  # the training step's compilation, then validation's
    assert all(m.startswith("--compile: ") and "graph(s) compiled in" in m for m in records.messages)


def test_an_unknown_compile_mode_is_refused():
    _, d = build()
    with pytest.raises(ValueError, match="--compile-mode must be one of default, reduce-overhead, max-autotune"):
        ConvS2STranslationTask(ConvS2STranslationConfig(compile=True, compile_mode="fastest", replace_unk=None), d, d)
