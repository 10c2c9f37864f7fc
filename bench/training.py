"""Training throughput: the same batches, initial weights, loss and optimizer for every model.

The update is fairseq's, with the demo recipe's settings (:data:`SETTINGS`: the paper's NAG,
learning rate, momentum and gradient clipping, and the demo's label smoothing): label-smoothed
cross entropy summed over the batch, gradients divided by the number of target tokens, clipped,
one NAG step. The models take turns update by update, so a slowdown from another process on
the machine hits all of them alike. Only the update itself is timed (forward, backward,
clipping, optimizer step), not batch loading.
"""
import contextlib
import itertools
import math
import time

import torch
from fairseq import utils
from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion
from fairseq.optim.nag import NAG

from convs2s_recipes.run import RECIPES
from convs2s_recipes.settings import training_config

from .data import RECIPE

# The settings of the recipe whose data the benchmark uses: recipes/configs/paper.yaml and
# recipe/multi30k_demo.yaml over it.
SETTINGS = training_config(RECIPES[RECIPE].config)


def fairseq_criterion(task):
    """fconv's loss: fairseq's label_smoothed_cross_entropy, with the settings' label smoothing."""
    return LabelSmoothedCrossEntropyCriterion(task, sentence_avg=False, label_smoothing=SETTINGS.criterion.label_smoothing)


def training_batches(task, max_tokens, count, seed=1, split="train"):
    """The first `count` batches of fairseq-train's shuffled epochs (as many epochs as needed;
    one at most for another split)."""
    task.load_dataset(split)
    epochs = task.get_batch_iterator(
        dataset=task.dataset(split), max_tokens=max_tokens, max_positions=(1024, 1024),
        ignore_invalid_inputs=True, seed=seed, required_batch_size_multiple=8,
    )
    batches = list(itertools.islice(epochs.next_epoch_itr(shuffle=split == "train"), count))
    while split == "train" and len(batches) < count:
        batches += itertools.islice(epochs.next_epoch_itr(shuffle=True), count - len(batches))
    return batches


def autocast(device, precision):
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device, dtype={"bf16": torch.bfloat16, "fp16": torch.float16}[precision])


def synchronize(device):
    if device == "cuda":
        torch.cuda.synchronize()


class TrainingRun:
    """One model trained update by update; keeps the time and loss of each update."""

    def __init__(self, name, model, task, precision="fp32", device="cpu", criterion=None, selection=None):
        """``selection``: a :class:`~fairseq_convs2s_ext.data.VocabularySelection` (ours only):
        each batch scores its candidates, the gold targets among them, as
        ``fairseq-train --vocab-selection`` does."""
        self.name, self.model, self.precision, self.device = name, model.to(device), precision, device
        self.selection, self.candidates = selection, []
        self.criterion = criterion or fairseq_criterion(task)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = NAG(self.params, lr=SETTINGS.optimization.lr[0], momentum=SETTINGS.optimizer.momentum,
                             weight_decay=SETTINGS.optimizer.weight_decay)
        self.scaler = torch.amp.GradScaler(device) if precision == "fp16" else None
        self.times, self.tokens, self.losses = [], [], []

    def update(self, sample):
        sample = utils.move_to_cuda(sample) if self.device == "cuda" else sample
        self.model.train()
        synchronize(self.device)
        start = time.perf_counter()
        if self.selection is not None:
            candidates = self.selection.candidates(sample["net_input"]["src_tokens"], sample["target"])
            sample = dict(sample, candidates=candidates)
            self.candidates.append(len(candidates))
        self.optimizer.zero_grad(set_to_none=True)
        with autocast(self.device, self.precision):
            loss, sample_size, log = self.criterion(self.model, sample)
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            self.scaler.unscale_(self.optimizer)
        else:
            loss.backward()
        for p in self.params:
            if p.grad is not None:
                p.grad.div_(sample_size)
        torch.nn.utils.clip_grad_norm_(self.params, SETTINGS.optimization.clip_norm)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        synchronize(self.device)
        self.times.append(time.perf_counter() - start)
        self.tokens.append(sample["ntokens"])
        self.losses.append(loss.item() / sample_size / math.log(2))

    def tokens_per_second(self, skip):
        return sum(self.tokens[skip:]) / sum(self.times[skip:])

    @torch.no_grad()
    def validation_loss(self, batches, task):
        """Label-smoothed loss and nll per target token (base 2) over `batches`, in fp32."""
        self.model.eval()
        criterion = fairseq_criterion(task)
        loss = nll = size = 0.0
        for sample in batches:
            sample = utils.move_to_cuda(sample) if self.device == "cuda" else sample
            l, s, log = criterion(self.model, sample)
            loss, nll, size = loss + l.item(), nll + float(log["nll_loss"]), size + s
        return loss / size / math.log(2), nll / size / math.log(2)


def train_side_by_side(runs, batches):
    """Every run does update i before any does update i + 1."""
    for sample in batches:
        for run in runs:
            run.update(sample)
