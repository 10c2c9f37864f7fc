"""Generation speed as fairseq-generate sees it: beam search over the test set.

Each model is prepared as fairseq-generate prepares it (``prepare_for_inference_``: fconv
swaps in BeamableMM, ours folds weight normalization) and translates with fairseq's
SequenceGenerator through ``task.inference_step``, batches of up to 128 sentences
(``--required-batch-size-multiple 1``, so no sentence is dropped).
"""
import argparse
import itertools
import time

from fairseq import utils
from fairseq.data import data_utils
from fairseq.sequence_scorer import SequenceScorer
from omegaconf import OmegaConf

from .training import autocast, synchronize


def generation_batches(task, batch_size, split="test", limit=None):
    task.load_dataset(split)
    itr = task.get_batch_iterator(
        dataset=task.dataset(split), max_sentences=batch_size, max_positions=(1024, 1024),
        ignore_invalid_inputs=True, required_batch_size_multiple=1,
    ).next_epoch_itr(shuffle=False)
    batches = list(itr)
    if limit is not None and limit < len(batches):  # spread over short and long sentences
        step = len(batches) / limit
        batches = [batches[int(i * step)] for i in range(limit)]
    return batches


def generation_options(beam, max_len_a=0.0, max_len_b=200):
    """fairseq-generate's defaults but for the beam (and length limit)."""
    return argparse.Namespace(beam=beam, max_len_a=max_len_a, max_len_b=max_len_b, min_len=1, lenpen=1.0,
                              unkpen=0.0, nbest=1)


def prepared(model, beam, device, need_attn=False):
    """`model` made ready as fairseq-generate does it (for one beam size: pass a fresh copy);
    ``need_attn``: its attention kept, as with ``--print-alignment``."""
    model = model.to(device).eval()
    cfg = OmegaConf.create({"generation": {"beam": beam, "no_beamable_mm": False,
                                           "print_alignment": "hard" if need_attn else None}})
    model.prepare_for_inference_(cfg)
    return model


class GenerationRun:
    def __init__(self, name, model, task, options, precision="fp32", device="cpu", need_attn=False):
        self.name, self.task, self.precision, self.device = name, task, precision, device
        self.model = prepared(model, options.beam, device, need_attn)
        self.generator = task.build_generator([self.model], options)
        self.times, self.hypotheses = [], {}

    def translate(self, batches):
        """Translate every batch once; returns the seconds it took."""
        total = sum(self.translate_batch(sample) for sample in batches)
        self.times.append(total)
        return total

    def translate_batch(self, sample):
        """Translate one batch, keeping its best hypotheses; returns the seconds it took."""
        sample = utils.move_to_cuda(sample) if self.device == "cuda" else sample
        synchronize(self.device)
        start = time.perf_counter()
        with autocast(self.device, self.precision):
            hypos = self.task.inference_step(self.generator, [self.model], sample)
        synchronize(self.device)
        seconds = time.perf_counter() - start
        for i, sample_id in enumerate(sample["id"].tolist()):
            self.hypotheses[sample_id] = hypos[i][0]["tokens"].cpu()
        return seconds

    def generated_tokens(self):
        return sum(len(t) for t in self.hypotheses.values())


def model_scores(model, task, batches, hypotheses):
    """``model``'s score of each sentence's hypothesis by fairseq's SequenceScorer (what
    fairseq-generate --score-reference prints: the mean log-probability of its words and
    end of sentence)."""
    target = task.target_dictionary
    scorer = SequenceScorer(target)
    scores = {}
    for sample in batches:
        ids = sample["id"].tolist()
        tokens = [hypotheses[i] for i in ids]
        previous = data_utils.collate_tokens(tokens, target.pad(), target.eos(), move_eos_to_beginning=True)
        scored = scorer.generate([model], {"net_input": dict(sample["net_input"], prev_output_tokens=previous),
                                           "target": data_utils.collate_tokens(tokens, target.pad(), target.eos())})
        scores.update({i: nbest[0]["score"].item() for i, nbest in zip(ids, scored)})
    return scores


def translate_in_turns(runs, batches, repeats):
    """Each batch is translated by every run in turn, `repeats` times; a run's time is the
    sum over the batches of its best time for each. Turns of a batch (a second or two)
    rather than of the whole set keep the ratios steady when load from outside the machine
    comes and goes (bench/README.md, "Noise"): every run meets a burst on the same batches."""
    best = {run.name: [float("inf")] * len(batches) for run in runs}
    for _, (i, sample), run in itertools.product(range(repeats), enumerate(batches), runs):
        best[run.name][i] = min(best[run.name][i], run.translate_batch(sample))
    return {name: sum(times) for name, times in best.items()}
