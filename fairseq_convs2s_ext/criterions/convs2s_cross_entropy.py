"""``--criterion convs2s_cross_entropy``: the training loss of ConvS2S.

Gehring et al. (2017), section 4: token-level negative log-likelihood whose gradients are
normalized by the number of non-padding target tokens. fairseq's published ConvS2S recipes
add label smoothing (``--label-smoothing 0.1``); the default, 0, is the paper's plain NLL.
With smoothing the values equal fairseq's ``label_smoothed_cross_entropy``'s; they are
computed from the logits by the implementation measured faster on the model's device
(``--loss-implementation``, see :mod:`.label_smoothed_loss`).

Logged like fairseq's criteria, in base 2 per target token: ``loss`` (the optimized,
possibly smoothed loss), ``nll_loss`` (the plain NLL, also with smoothing on) and ``ppl``
(2 ** nll_loss). A batch without target tokens gives a loss of 0 with weight 0 instead of
dividing by zero, so it leaves the running averages unchanged and logs no NaN.

With vocabulary selection (``sample["candidates"]``, set by ``convs2s_translation``'s
``--vocab-selection``), the softmax, the loss and its smoothing are over the batch's
candidate words, which include every gold target word; the padding id is a candidate at its
own position, so padding is still ignored.
"""
import math
from dataclasses import dataclass, field

from fairseq import utils
from fairseq.criterions import FairseqCriterion, register_criterion
from fairseq.dataclass import FairseqDataclass
from fairseq.logging import metrics

from ..data import local_indices
from .label_smoothed_loss import IMPLEMENTATIONS, label_smoothed_cross_entropy


@dataclass
class ConvS2SCrossEntropyConfig(FairseqDataclass):
    label_smoothing: float = field(
        default=0.0,
        metadata={"help": "label smoothing epsilon; 0 (the default) is the paper's plain NLL, "
                          "fairseq's ConvS2S recipes use 0.1"},
    )
    loss_implementation: str = field(
        default="auto",
        metadata={"help": "how the loss is computed from the logits, with the same numbers: fused "
                          "(torch's cross_entropy, fastest on a GPU), blockwise (a block of rows at a "
                          "time, fastest on a CPU), or auto: the one measured faster on the model's "
                          "device", "choices": IMPLEMENTATIONS},
    )


@register_criterion("convs2s_cross_entropy", dataclass=ConvS2SCrossEntropyConfig)
class ConvS2SCrossEntropyCriterion(FairseqCriterion):
    def __init__(self, task, label_smoothing, loss_implementation="auto"):
        super().__init__(task)
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(f"--label-smoothing must be in [0, 1), got {label_smoothing}")
        if loss_implementation not in IMPLEMENTATIONS:
            raise ValueError(f"--loss-implementation must be one of {', '.join(IMPLEMENTATIONS)}, "
                             f"got {loss_implementation!r}")
        self.label_smoothing = label_smoothing
        self.loss_implementation = loss_implementation

    def forward(self, model, sample, reduce=True):
        """Return the summed loss, the number of non-padding target tokens (fairseq divides
        the gradients by it) and the logging output."""
        candidates = sample.get("candidates")
        if candidates is None:
            net_output = model(**sample["net_input"])
            target = model.get_targets(sample, net_output)
        else:  # vocabulary selection: logits over the candidates, targets as their positions
            net_output = model(**sample["net_input"], candidates=candidates)
            target = local_indices(candidates, model.get_targets(sample, net_output))
        loss, nll_loss = label_smoothed_cross_entropy(net_output[0], target, self.label_smoothing, self.padding_idx,
                                                      self.loss_implementation, reduce)
        sample_size = sample["ntokens"]
        logging_output = {
            "loss": loss.data,
            "nll_loss": nll_loss.data,
            "ntokens": sample["ntokens"],
            "nsentences": sample["target"].size(0),
            "sample_size": sample_size,
        }
        return loss, sample_size, logging_output

    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        loss_sum = sum(log.get("loss", 0) for log in logging_outputs)
        nll_loss_sum = sum(log.get("nll_loss", 0) for log in logging_outputs)
        ntokens = sum(log.get("ntokens", 0) for log in logging_outputs)
        sample_size = sum(log.get("sample_size", 0) for log in logging_outputs)
        metrics.log_scalar("loss", _per_token_bits(loss_sum, sample_size), sample_size, round=3)
        metrics.log_scalar("nll_loss", _per_token_bits(nll_loss_sum, ntokens), ntokens, round=3)
        metrics.log_derived("ppl", lambda meters: utils.get_perplexity(meters["nll_loss"].avg))

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True


def _per_token_bits(total, count):
    """``total`` nats over ``count`` tokens in bits per token; 0 for no tokens (logged with
    weight 0, so it does not move the averages)."""
    return total / count / math.log(2) if count > 0 else 0.0
