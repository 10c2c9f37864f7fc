"""A model that ``convs2s-export`` wrote, loaded and translating, without fairseq.

    from convs2s_serving import ExportedModel, translate
    model = ExportedModel("exported/")
    translate(model, ["A dog runs through the snow."], beam=5)          # raw text
    model.translate_tokens([["A", "dog", "runs", "."]])                  # tokens (BPE'd)

    convs2s-serve exported/ < news.en > news.de                           # serving/cli.py

What it needs: torch (the two programs are ``torch.export``'s, checked by
:mod:`.safe_loading` before ``torch.export.load`` reads them; W_o's tensors are read by
torch's ``weights_only`` unpickler), and for raw text the
package's tokenizer and BPE (sacremoses, subword-nmt). The search is :mod:`.search`,
fairseq's; batches are sentences of similar length, as fairseq-generate and the hub make
them.
"""
import contextlib
import itertools
import json
import os
from typing import List, Optional, Sequence

import torch

from . import int8_linear, search_step, top_log_probs
from .candidates import cluster_sizes
from .compiled import CompiledProgram
from .output_layer import EveryWord, SentenceCandidates
from .safe_loading import load_exported, load_tensors
from .search import Hypothesis, SearchOptions, beam_search
from .workers import started_pool

FORMAT = 2  # the model.json format read here (fairseq_convs2s_ext.generation.export writes it)
OUTPUT_LAYER = "output.pt"  # W_o's tensors: the step program returns the features it multiplies
SELECTION = "selection.pt"  # each source word's candidate target words, and the clusters of the others
BPE_SEPARATOR = "@@"


class ExportedModel:
    """The folder ``convs2s-export`` wrote: the encoder and the decoder's step (torch.export
    programs), the vocabularies and, where the model was trained on a ``convs2s-prepare``
    folder, its languages and BPE codes. ``compile``: the two programs compiled to C++ by
    AOTInductor (:mod:`.compiled`), built on first use and cached; else run by torch from
    Python. ``vocabulary_selection``: where the export has it (``convs2s-export
    --vocab-selection``), each sentence's words are its candidates only; False: every word.
    ``workers``: translate in that many processes side by side, each with this process's
    threads shared out (at least one) and a model of its own, every batch queued at once
    and taken by whichever is free, the longest first, as the plugin's ``HubWorkers`` shares
    out the hub's; the translations are the same. The model is loaded (and compiled) here
    first, so that a folder that cannot be used fails before any process starts; ``close()``
    (or ``with``) ends them."""

    def __init__(self, directory, compile: bool = False, vocabulary_selection: bool = True, workers: int = 1):
        if workers < 1:
            raise ValueError(f"workers must be at least 1, not {workers}")
        self.directory = os.fspath(directory)
        config_path = os.path.join(self.directory, "model.json")
        if not os.path.isfile(config_path):
            raise FileNotFoundError(f"{self.directory}: no model.json: not a folder written by convs2s-export")
        try:
            with open(config_path, encoding="utf-8") as f:
                config = json.load(f)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"{config_path}: not convs2s-export's JSON ({e}): export the model again") from None
        if not isinstance(config, dict) or config.get("format") != FORMAT:
            found = config.get("format") if isinstance(config, dict) else None
            raise ValueError(f"{config_path}: format {found}, this runtime reads format {FORMAT}: "
                             "export the model again with this version's convs2s-export")
        if config.get("quantize") == "int8":  # before any program is loaded
            levels = config.get("int8_weight_levels", 127)
            int8_linear.take_product_for_levels(levels)
            exact = int8_linear.weight_levels()
            if exact is None or levels > exact:
                sums = f"sums them exactly only up to {exact} (no VNNI)" if exact else "does not sum them exactly"
                raise ValueError(f"{config_path}: its int8 weights reach {levels}, and this CPU's int8 product {sums}: "
                                 "export it again on a CPU like this one (convs2s-export --quantize int8), or in float32")
        self.config = config
        self.source_symbols, self.target_symbols = config["source_symbols"], config["target_symbols"]
        self.source_index = {word: i for i, word in enumerate(self.source_symbols)}
        self.eos, self.pad, self.unk, self.nspecial = (config[k] for k in ("eos", "pad", "unk", "nspecial"))
        self.vocabulary_size = len(self.target_symbols)
        self.windows = [tuple(shape) for shape in config["windows"]]
        self.max_target_positions = config["max_target_positions"]
        self.positions = torch.arange(self.max_target_positions)  # a step's, a 0-d tensor each: none made per step
        self.max_source_positions = config["max_source_positions"]
        paths = [os.path.join(self.directory, name) for name in ("encoder.pt2", "step.pt2")]
        programs = [load_exported(path) for path in paths]  # both checked before either is compiled
        # each worker's threads: this process's shared out (a compiled library is built for a number of threads,
        # so this process builds the workers' one, once, before they start)
        threads = max(1, torch.get_num_threads() // workers)
        with _threads(threads):
            self.encoder, self.decoder_step = [CompiledProgram(path, checked) if compile else checked.program.module()
                                               for path, checked in zip(paths, programs)]
        self.output_layer = self._output_layer(config.get("quantize") == "int8")
        self.selection = self._selection() if vocabulary_selection and "vocabulary_selection" in config else None
        top_log_probs.load()  # the search's kernels, built now if need be rather than in the first batch
        search_step.load()
        if config.get("quantize") == "int8":
            int8_linear.KERNEL.load()  # the int8 layers' kernel, likewise
        self.workers, self.threads, self.pool = workers, threads, None
        if workers > 1:  # this process's model checked, compiled and loaded first: a bad folder fails here
            self.pool = started_pool(workers, _load_worker, (threads, self.directory, compile, vocabulary_selection))

    def close(self):
        """End the worker processes, if any."""
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)
            self.pool = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def bpe_codes(self) -> Optional[str]:
        path = os.path.join(self.directory, "bpe.codes")
        return path if os.path.isfile(path) else None

    def encode(self, src_tokens):
        return self.encoder(src_tokens)

    def step(self, tokens, step: int, windows, z, sources):
        """The features of the next word of each hypothesis, and the windows moved on."""
        return self.decoder_step(tokens, self.positions[step], windows, z, sources)

    def output_layer_for(self, src_tokens: torch.Tensor, beam: int):
        """W_o for a batch of ``src_tokens`` searched with ``beam``: over each sentence's
        candidates where the export has vocabulary selection and it is on, else over the
        whole vocabulary."""
        if self.selection is not None:
            return SentenceCandidates(self.output_layer, self.selection, src_tokens)
        return EveryWord(self.output_layer, len(src_tokens) * beam)

    def _output_layer(self, int8: bool):
        """``output.pt``'s W_o, checked against the vocabulary."""
        path = os.path.join(self.directory, OUTPUT_LAYER)
        matrix = {"weight_int8": (torch.int8, 2), "weight_scale": (torch.float32, 1)} if int8 else {
            "weight": (torch.float32, 2)}
        layer = load_tensors(path, {**matrix, "bias": (torch.float32, 1)})
        weight = layer["weight_int8" if int8 else "weight"]
        rows, width = self.vocabulary_size, self.config.get("output_features")
        if any(len(t) != rows for t in layer.values()) or weight.size(1) != width:
            raise ValueError(f"{path}: W_o is {len(weight)} x {weight.size(1)} where model.json gives {rows} words "
                             f"x {width} features: export the model again")
        if int8 and int(weight.abs().max()) > self.config.get("int8_weight_levels", 127):
            raise ValueError(f"{path}: W_o's int8 weights reach beyond model.json's int8_weight_levels: "
                             "export the model again")
        return {name: tensor.contiguous() for name, tensor in layer.items()}

    def _selection(self):
        """``selection.pt``'s tables (:func:`fairseq_convs2s_ext.generation.export.selection_tables`),
        checked against the vocabularies and W_o; the clusters' rows under ``rest_rows``, their
        sizes under ``rest_sizes``."""
        path = os.path.join(self.directory, SELECTION)
        recorded = self.config["vocabulary_selection"]
        clusters = recorded.get("rest_clusters") if isinstance(recorded, dict) else None
        if not isinstance(clusters, int) or clusters < 0:
            raise ValueError(f"{os.path.join(self.directory, 'model.json')}: its vocabulary_selection is not "
                             "convs2s-export's: export the model again")
        expected = {"aligned": (torch.int32, 2), "always": (torch.int64, 1)}
        if clusters:  # the clusters' mean rows of W_o, stored as W_o is
            weight = {"rest_weight_int8": (torch.int8, 2), "rest_weight_scale": (torch.float32, 1)} \
                if "weight_int8" in self.output_layer else {"rest_weight": (torch.float32, 2)}
            expected.update(weight, rest_bias=(torch.float32, 1), rest_labels=(torch.int64, 1))
        tables = load_tensors(path, expected)
        aligned, always, words = tables["aligned"], tables["always"], self.vocabulary_size
        fits = (len(aligned) == len(self.source_symbols) and bool(((aligned >= 0) & (aligned < words)).all())
                and torch.equal(always[: self.nspecial], torch.arange(self.nspecial))
                and bool((always[1:] > always[:-1]).all()) and int(always[-1]) < words)
        if clusters:
            labels = tables["rest_labels"]
            rows = [t for name, t in tables.items() if name.startswith("rest_") and name != "rest_labels"]
            fits = (fits and len(labels) == words and bool(((labels >= -1) & (labels < clusters)).all())
                    and bool((labels[always] == -1).all()) and all(len(t) == clusters for t in rows)
                    and all(t.size(1) == self.config["output_features"] for t in rows if t.dim() == 2)
                    and all(int(t.abs().max()) <= self.config.get("int8_weight_levels", 127)
                            for t in rows if t.dtype == torch.int8))  # summed exactly, as W_o's
        if not fits:
            raise ValueError(f"{path}: its candidate tables do not fit model.json's vocabularies and W_o: "
                             "export the model again")
        if clusters:  # the clusters' rows named as W_o's own (output.pt's), for the batches to append
            tables["rest_rows"] = {name[len("rest_"):]: tables.pop(name) for name in list(tables)
                                   if name.startswith("rest_") and name != "rest_labels"}
            tables["rest_sizes"] = cluster_sizes(tables["rest_labels"], clusters)
        return tables

    def source_ids(self, words: Sequence[str]) -> List[int]:
        """fairseq's ``encode_line``: each word's id (``<unk>``'s where the source vocabulary
        lacks it), then eos."""
        unk = self.config["source_unk"]
        return [self.source_index.get(word, unk) for word in words] + [self.config["source_eos"]]

    def target_words(self, ids) -> List[str]:
        """The words of target ids, eos left out."""
        return [self.target_symbols[i] for i in ids.tolist() if i != self.eos]

    def translate_ids(self, sentences: List[List[int]], options: SearchOptions,
                      batch_size: int = 128) -> List[List[Hypothesis]]:
        """The hypotheses of each sentence (source ids ending with eos), best first: batches
        of ``batch_size`` sentences of similar length, left-padded; a sentence without words
        gets none (the plugin translates it as empty)."""
        too_long = [i for i, s in enumerate(sentences) if len(s) > self.max_source_positions]
        if too_long:
            raise ValueError(f"sentence {too_long[0] + 1} has {len(sentences[too_long[0]])} tokens, more than the "
                             f"model's {self.max_source_positions} source positions")
        results: List[List[Hypothesis]] = [[] for _ in sentences]
        order = sorted((i for i, s in enumerate(sentences) if len(s) > 1), key=lambda i: len(sentences[i]))
        batches = [order[start: start + batch_size] for start in range(0, len(order), batch_size)][::-1]
        sources = [[sentences[i] for i in batch] for batch in batches]  # the longest first: workers end together
        if self.pool is None:
            found = (self.search(batch, options) for batch in sources)
        else:  # every batch queued at once, so that a worker finds its next one waiting
            found = (_hypotheses(sent) for sent in self.pool.map(_search_in_worker, sources, itertools.repeat(options)))
        for batch, hypotheses in zip(batches, found):
            for i, h in zip(batch, hypotheses):
                results[i] = h
        return results

    def search(self, sentences: List[List[int]], options: SearchOptions) -> List[List[Hypothesis]]:
        """:func:`.search.beam_search` of one batch of sentences (source ids ending with eos,
        each with a word), left-padded."""
        width = max(len(ids) for ids in sentences)
        src_tokens = torch.full((len(sentences), width), self.config["source_pad"], dtype=torch.long)
        for row, ids in enumerate(sentences):
            src_tokens[row, width - len(ids):] = torch.tensor(ids)
        return beam_search(self, src_tokens, options)

    def translate_tokens(self, sentences: List[List[str]], batch_size: int = 128, **options) -> List[List[str]]:
        """The best hypothesis of each sentence (a list of tokens, BPE'd as the model's data),
        as tokens; ``options``: :class:`SearchOptions`'s (beam, lenpen, max_len_a, ...)."""
        found = self.translate_ids([self.source_ids(s) for s in sentences], SearchOptions(**options), batch_size)
        return [self.target_words(h[0].tokens) if h else [] for h in found]


@contextlib.contextmanager
def _threads(threads: int):
    """torch's threads set to ``threads`` for the block."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


_WORKER_MODEL = None  # in a worker process: its model


def _load_worker(threads, directory, compile, vocabulary_selection):
    global _WORKER_MODEL
    torch.set_num_threads(threads)
    _WORKER_MODEL = ExportedModel(directory, compile=compile, vocabulary_selection=vocabulary_selection)
    load_text_processing(_WORKER_MODEL)


def _search_in_worker(sentences, options):
    """A batch's hypotheses as lists and floats: pickling a sentence's 15 small tensors between
    processes cost more than searching it (one sentence a batch)."""
    return [[(h.tokens.tolist(), h.score, h.positional_scores.tolist()) for h in hypotheses]
            for hypotheses in _WORKER_MODEL.search(sentences, options)]


def _hypotheses(sent):
    """The hypotheses a worker sent (:func:`_search_in_worker`), as :class:`Hypothesis`."""
    return [[Hypothesis(torch.tensor(tokens), score, torch.tensor(positional, dtype=torch.float32))
             for tokens, score, positional in hypotheses] for hypotheses in sent]


def translate(model: ExportedModel, lines: List[str], batch_size: int = 128, **options) -> List[str]:
    """Raw sentences in, raw translations out: normalized and tokenized as ``convs2s-prepare``
    prepared the model's data, segmented with its BPE codes, translated, joined and
    detokenized. With workers, they tokenize and detokenize too, a share of the lines each."""
    source, target = model.config.get("source_lang"), model.config.get("target_lang")
    if source is None or target is None:
        raise ValueError(f"{model.directory}: the export records no languages: translate tokens instead "
                         "(translate_tokens), or export with --data of a convs2s-prepare folder")
    if model.pool is None:
        return _detokenized(model, model.translate_tokens(_tokenized(model, lines), batch_size, **options))
    tokens = _shared_out(model, _tokenize_in_worker, lines)
    return _shared_out(model, _detokenize_in_worker, model.translate_tokens(tokens, batch_size, **options))


def _shared_out(model: ExportedModel, work, items: list) -> list:
    """``work`` of ``items`` in the model's workers, a few pieces each, in order."""
    share = max(1, -(-len(items) // (4 * model.workers)))
    return list(itertools.chain.from_iterable(model.pool.map(
        work, [items[i:i + share] for i in range(0, len(items), share)])))


def load_text_processing(model: ExportedModel) -> None:
    """Load what :func:`translate` needs for raw text where the export has it (Moses'
    tokenizer and detokenizer, the BPE codes): half a second of imports and codes that the
    first sentences would otherwise wait for. The workers load it as they load the model."""
    if model.config.get("source_lang") and model.config.get("target_lang"):
        _detokenized(model, _tokenized(model, ["."]))


def _tokenized(model: ExportedModel, lines: List[str]) -> List[List[str]]:
    """Each line's tokens, BPE'd as the model's data."""
    from convs2s_preprocess.stages.bpe import apply_bpe
    from convs2s_preprocess.stages.tokenize import normalize_and_tokenize

    source = model.config["source_lang"]
    romanian = model.config.get("romanian", False) and source == "ro"
    tokenized = [normalize_and_tokenize(line, source, romanian) for line in lines]
    if model.bpe_codes:
        tokenized = [apply_bpe(line, model.bpe_codes) for line in tokenized]
    return [line.split() for line in tokenized]


def _detokenized(model: ExportedModel, translations: List[List[str]]) -> List[str]:
    """Each translation's BPE pieces joined and detokenized."""
    from convs2s_preprocess.stages.tokenize import detokenize

    joined = [(" ".join(words) + " ").replace(BPE_SEPARATOR + " ", "").rstrip() for words in translations]
    return [detokenize(line, model.config["target_lang"]) for line in joined]


def _tokenize_in_worker(lines):
    return _tokenized(_WORKER_MODEL, lines)


def _detokenize_in_worker(translations):
    return _detokenized(_WORKER_MODEL, translations)
