"""Translating in processes side by side: the hub's batches shared out among workers.

    from fairseq_convs2s_ext.models.hub_workers import HubWorkers
    with HubWorkers(2, "checkpoints", "checkpoint_best.pt", "data", quantize="int8") as workers:
        translations = workers.translate(sentences, beam=5)

On a CPU, one process of T threads leaves cores waiting: a decoder step is a few small matrix
products, each split T ways, with the threads meeting at a barrier after every one of them,
and Python between them on one core. ``N`` processes of ``T / N`` threads each, every one
translating whole batches of its own, can keep the cores busier, as CTranslate2's translators
side by side (``inter_threads``) do. In the serving benchmark on a 2-core Intel Xeon
(docs/performance.md), ours int8 in two processes of one thread translated 5-9% more
sentences a second than in one process of two with AVX-512 VNNI; held to AVX2 instructions
1-6% more as trained and 2-5% fewer at equal work: measure it on your machine. Each worker
holds a copy of the model.

The translations are the one-process hub's (``hub.translate``) with the same threads per
batch: this process loads the model too, segments nothing itself and makes fairseq's batches
(:meth:`ConvS2SHubInterface.batches`); each batch's sentences go to the next free worker, the
longest first, and that worker translates them as the very same batch. Tokenizing and BPE run
in the workers as well, a share each. The workers run on the CPU.
"""
import itertools
from typing import Callable, List, Optional

import torch
from convs2s_serving.workers import started_pool

from .hub_interface import check_sentences, from_pretrained

_HUB = None  # in a worker: its hub


def _load(threads, args, kwargs):
    global _HUB
    torch.set_num_threads(threads)
    _HUB = from_pretrained(*args, **kwargs)


def _segment(sentences, preprocess, hub=None):
    """Each sentence's BPE pieces (in text)."""
    hub = hub or _HUB
    return [hub.segment(preprocess(sentence) if preprocess else sentence) for sentence in sentences]


def _segment_and_binarize(sentences, preprocess):
    """Each sentence's BPE pieces and their token ids."""
    return [(text, _HUB.binarize(text).tolist()) for text in _segment(sentences, preprocess)]


def _translate(texts, beam, kwargs, postprocess, hub=None):
    translations = (hub or _HUB).sample_segmented(texts, beam, **kwargs)
    return [postprocess(t) for t in translations] if postprocess else translations


class HubWorkers:
    """``workers`` processes with ``threads`` torch threads each (default: this process's
    threads shared out, at least one), each holding the hub that
    ``from_pretrained(*args, **kwargs)`` loads (:func:`.hub_interface.from_pretrained`).
    The model is loaded here first, so that a checkpoint that cannot be used fails before
    any process starts; ``workers=1`` starts none and translates here, with this process's
    threads (``hub``: move it to a GPU there)."""

    def __init__(self, workers: int, *args, threads: Optional[int] = None, **kwargs):
        if workers < 1:
            raise ValueError(f"workers must be at least 1, not {workers}")
        self.threads = threads or max(1, torch.get_num_threads() // workers)
        if workers == 1:
            torch.set_num_threads(self.threads)
        self.workers = workers
        self.hub = from_pretrained(*args, **kwargs)
        self.pool = None
        if workers > 1:
            self.pool = started_pool(workers, _load, (self.threads, args, kwargs))

    def translate(self, sentences: List[str], beam: int = 5, nbest: int = 1,
                  preprocess: Optional[Callable[[str], str]] = None, postprocess: Optional[Callable[[str], str]] = None,
                  **kwargs) -> list:
        """``hub.translate(sentences, beam, nbest=nbest, **kwargs)`` (``lenpen``,
        ``replace_unk``, ...), translated by the workers. ``preprocess``, ``postprocess``: a
        function (that pickle can send: a module's function, or a ``functools.partial`` of
        one) that the workers apply to each sentence before the hub's tokenizer, and to each
        translation (``nbest=1``)."""
        check_sentences(sentences)
        if postprocess is not None and nbest != 1:
            raise ValueError("postprocess takes a translation, nbest=1")
        if self.pool is None:
            texts = _segment(sentences, preprocess, self.hub)
            return _translate(texts, beam, dict(kwargs, nbest=nbest), postprocess, self.hub)
        share = max(1, -(-len(sentences) // (4 * self.workers)))  # a few pieces a worker
        pieces = [sentences[i:i + share] for i in range(0, len(sentences), share)]
        segmented = list(itertools.chain.from_iterable(
            self.pool.map(_segment_and_binarize, pieces, itertools.repeat(preprocess))))
        tokens = [torch.tensor(ids, dtype=torch.long) for _, ids in segmented]
        self.hub._check_lengths(tokens)
        words = [i for i, t in enumerate(tokens) if t.numel() > 1]  # an empty sentence is </s> alone
        batches = self.hub.batches([tokens[i] for i in words])[::-1]  # the longest first
        jobs = [[segmented[words[j]][0] for j in batch] for batch in batches]
        outputs = [""] * len(sentences) if nbest == 1 else [[""] * nbest for _ in sentences]
        options = dict(kwargs, nbest=nbest)
        translated = self.pool.map(_translate, jobs, itertools.repeat(beam), itertools.repeat(options),
                                   itertools.repeat(postprocess))
        for batch, translations in zip(batches, translated):
            for j, translation in zip(batch, translations):
                outputs[words[j]] = translation
        return outputs

    def close(self):
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
