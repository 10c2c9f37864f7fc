"""``--task convs2s_translation``: fairseq's translation task with the paper's unknown-word
replacement in fairseq-generate and fairseq-interactive.

    fairseq-generate DATA --user-dir fairseq_convs2s_ext --task convs2s_translation \\
        --dataset-impl raw --path CKPT --replace-unk align.dict  # dictionary, else copy
    fairseq-generate ... --replace-unk             # copy the attended source word
    fairseq-interactive DATA ... --replace-unk align.dict < raw-sentences

Training is unchanged from ``--task translation`` (a model trained with either generates with
either) unless ``--vocab-selection`` or ``--autocast-bf16`` is given, except that a run
resumed from a checkpoint continues the uninterrupted run exactly. What this task adds,
each through a task hook:

- ``build_generator``: fairseq's generator with the lean beam step (each hypothesis offers
  the search only its 2 x beam best words, which finds the same hypotheses with less work;
  see :mod:`fairseq_convs2s_ext.generation.lean_beam_step`) where it was measured faster
  (the CPU; ``--beam-step``), else fairseq's own; with ``--replace-unk``, wrapped in
  :class:`~fairseq_convs2s_ext.generation.unknown_words.UnknownWordReplacer`, which does the replacement
  (see that module for the rules). fairseq's own replacement is broken for every model
  (its generator returns no alignment), and the wrapper leaves it nothing to do.
- ``load_dataset``: with ``--replace-unk``, the split's words from fairseq's raw-text dataset
  (``--dataset-impl raw``, which fairseq-generate requires with ``--replace-unk``; see
  :mod:`fairseq_convs2s_ext.data.source_text`) reach the replacement with every batch.
- ``get_interactive_tokens_and_lengths``, ``build_dataset_for_inference``,
  ``inference_step``: fairseq-interactive's input lines (after ``--tokenizer``/``--bpe``)
  reach the replacement (:mod:`fairseq_convs2s_ext.generation.interactive_input`).
- ``get_batch_iterator``: fairseq drops a split's last batch when its size is not a multiple
  of ``--required-batch-size-multiple`` (8 by default; ``data_utils.batch_by_size``), which
  silently loses up to the last N mod 8 sentences. Only the training split keeps the multiple;
  validation, fairseq-generate and fairseq-interactive batch with a multiple of 1, so every
  sentence is translated.
- ``build_model``: refuses a model configuration whose strings fairseq would evaluate as code
  (:mod:`fairseq_convs2s_ext.checkpoints.safe_loading`, which checks every checkpoint as it is
  read; here the configuration given on the command line is checked too).
- ``__init__`` (fairseq-train, fairseq-hydra-train): one training per ``--save-dir``, whose
  lock the run holds to its end (:mod:`fairseq_convs2s_ext.checkpoints.save_dir_lock`).
- ``load_dataset``: a split's binarized files are checked first (``.idx`` and ``.bin``
  agree, ids within the dictionaries; :mod:`fairseq_convs2s_ext.data.binarized`): a damaged
  file is named, not read; a missing one (a side of the split, or, but in fairseq-generate,
  which translates a source alone, the target side) is named before training starts
  (:mod:`fairseq_convs2s_ext.data.splits`).
- ``load_dictionary``: records the file a dictionary came from, so that a checkpoint trained
  with other dictionaries is refused with a message naming it (see
  :mod:`fairseq_convs2s_ext.checkpoints.dictionaries`).
- ``get_batch_iterator`` (fairseq-train resumed): fairseq orders a split's sentences for
  batching with the seed plus the epoch at which it makes the iterator, and keeps those
  batches for every later epoch. An uninterrupted run makes them at epoch 1, a run resumed
  from a checkpoint at the epoch it resumes in: sentences of equal length fall into other
  batches, and the resumed training differs from the uninterrupted one. Here the batches a
  run keeps are always those of epoch 1, so a resumed run continues the same training.
- ``get_batch_iterator`` (fairseq-interactive): an input line longer than the model takes
  is reported on stderr and skipped, and the lines after it are translated (same module);
  in a split of fairseq-generate or of validation, such a sentence is refused in one line
  naming it, unless --skip-invalid-size-inputs-valid-test (:mod:`fairseq_convs2s_ext.data.splits`).
- ``inference_step``: an empty source gives an empty translation
  (:mod:`fairseq_convs2s_ext.generation.empty_sources`).
- ``build_generator``, ``inference_step``: fairseq's options that fail inside fairseq work:
  ``--diverse-beam-groups`` (fairseq's search replaced by a repaired one) and ``--print-step``
  (each hypothesis's steps recorded); ``--score-reference`` in fairseq-interactive, which has
  no reference, is refused in one line
  (:mod:`fairseq_convs2s_ext.generation.fairseq_options`).
- ``add_args``: a bare ``--replace-unk`` means "copy only", as fairseq documents, instead of
  the dictionary file "@@ " that fairseq's option declares as its constant.
- ``train_step``, ``valid_step``, ``inference_step``: with ``--vocab-selection FILE``, each
  batch gets its candidate target words (``sample["candidates"]``, see
  :mod:`fairseq_convs2s_ext.data.vocabulary_selection`: in training and validation the
  batch's, the gold targets among them; in generation each sentence's own), which the
  criterion and the generator hand to the model. ``build_generator`` has each model's
  decoder estimate the words outside a sentence's candidates (``--vocab-rest-clusters``).
- ``train_step``, ``valid_step``, ``inference_step``: with ``--autocast-bf16`` (on), the
  model runs under ``torch.autocast(bfloat16)`` (matrix multiplies in bf16; weights, optimizer
  and the loss in fp32), on CPU too, where fairseq's ``--bf16`` expects a TPU and ``--amp``
  is CUDA only. The backward pass runs outside autocast, as torch recommends. Whether bf16
  pays on a CPU is measured, not assumed (:func:`~fairseq_convs2s_ext.hardware.choose_bf16`:
  a short probe of bf16 against fp32 matrix multiplies at the model's sizes, cached per
  machine): where bf16 was slower, ``--autocast-bf16`` is refused with the figures
  (:class:`~fairseq_convs2s_ext.hardware.Bf16UnsupportedError`) instead of crawling in
  silence, and ``--autocast-bf16 auto`` takes fp32 and logs why.
- ``train_step``, ``valid_step``: with ``--compile``, the model runs under ``torch.compile``
  (:mod:`fairseq_convs2s_ext.compilation`).
- ``build_generator``: with ``--quantize int8`` (generation on a CPU), the decoders' linear
  layers multiply in int8 (:mod:`fairseq_convs2s_ext.generation.quantization`), quantized once,
  after loading and generation's folds.

Reaching into fairseq: ``add_args`` changes the constant of fairseq's ``--replace-unk``
option (``parser._actions``: argparse has no public way to change an added option), because
fairseq-generate reads that value as a file before any task hook runs; a test fails if
fairseq's option changes.
"""
import contextlib
import copy
from dataclasses import dataclass, field
from typing import Optional

import torch
from fairseq import utils
from fairseq.tasks import register_task
from fairseq.tasks.translation import TranslationConfig, TranslationTask
from omegaconf import II

from ..checkpoints import check_config, save_dir_lock
from ..compilation import MODES, CompiledModels
from ..data import SelectionOptionError, SourceTextDataset, SourceTextError, VocabularySelection, raw_lines
from ..data.binarized import check_split
from ..data.splits import SplitError, missing_files, too_long
from ..command import fairseq_command
from ..generation import LeanSequenceGenerator, LeanSequenceGeneratorWithAlignment
from ..generation.empty_sources import with_empty_translations
from ..generation.fairseq_options import (SCORE_REFERENCE_INTERACTIVE, GenerationOptionError, with_decoding_steps,
                                          with_repaired_search)
from ..generation.interactive_input import InteractiveInput
from ..generation.unknown_words import UnknownWordReplacer, read_align_dict
from ..generation.quantization import QUANTIZE_MODES, QuantizeOptionError, check_mode, quantize_
from ..hardware import BF16_MODES, bf16_mode, choose_bf16, fastest


BEAM_STEPS = ("auto", "lean", "stock")
TRAINING_COMMANDS = ("train", "hydra_train")


@dataclass
class ConvS2STranslationConfig(TranslationConfig):
    # fairseq-generate's and fairseq-interactive's --replace-unk, which load_dataset must know
    # before any generator is built (None when not replacing, and in fairseq-train).
    replace_unk: Optional[str] = II("generation.replace_unk")
    # fairseq-train's --save-dir and the process's rank: a training holds its folder's lock.
    save_dir: Optional[str] = II("checkpoint.save_dir")
    distributed_rank: int = II("distributed_training.distributed_rank")
    vocab_selection: Optional[str] = field(
        default=None,
        metadata={"help": "vocabulary selection: score only each batch's candidate target words, "
                          "read from this file (convs2s-align-dict --candidates)"},
    )
    vocab_most_common: int = field(
        default=500,
        metadata={"help": "vocabulary selection: the N most frequent target words (by the candidates "
                          "file's counts) are candidates"},
    )
    vocab_top_aligned: int = field(
        default=100,
        metadata={"help": "vocabulary selection: each source word's K most often aligned target "
                          "words are candidates"},
    )
    vocab_rest_clusters: int = field(
        default=32,
        metadata={"help": "vocabulary selection, in generation: the softmax's normaliser also "
                          "counts the words left out of a sentence's candidates, estimated from "
                          "N clusters of the output layer's rows; 0: the softmax over the "
                          "candidates alone, as fairseq-lua"},
    )
    autocast_bf16: str = field(
        default="off",
        metadata={"help": "run the model under torch.autocast(bfloat16), on CPU or GPU (matrix multiplies "
                          "in bf16; fp32 weights, optimizer state and loss): on (a bare --autocast-bf16; "
                          "refused, with the figures, on a CPU where a short probe measured bf16 matrix "
                          "multiplies at the model's sizes slower than fp32), auto (bf16 where the probe "
                          "measured it faster, else fp32; the choice and why are logged) or off",
                  "choices": BF16_MODES, "argparse_const": "on"},
    )
    beam_step: str = field(
        default="auto",
        metadata={"help": "beam search's step: lean (each hypothesis offers its 2 x beam best words; "
                          "the same hypotheses with less work on a CPU), stock (fairseq's), or auto: "
                          "the one measured faster on the model's device; --vocab-selection needs lean",
                  "choices": BEAM_STEPS},
    )
    compile: bool = field(
        default=False,
        metadata={"help": "train and validate with the model under torch.compile (dynamic shapes; "
                          "compile time and recompilations are logged)"},
    )
    compile_mode: str = field(
        default="default",
        metadata={"help": "torch.compile's mode with --compile; reduce-overhead uses CUDA graphs "
                          "(with --required-seq-len-multiple to keep the shapes few)", "choices": MODES},
    )
    quantize: str = field(
        default="none",
        metadata={"help": "generation on a CPU: int8 (the decoder's matrix products in int8, weights per "
                          "output channel, activations per row; see generation.quantization) or none "
                          "(float32)", "choices": QUANTIZE_MODES},
    )


@register_task("convs2s_translation", dataclass=ConvS2STranslationConfig)
class ConvS2STranslationTask(TranslationTask):
    """Translation with unknown-word replacement (Gehring et al. 2017, word-based models)."""

    cfg: ConvS2STranslationConfig
    handles_convs2s = True  # the model warns under a task without it (models/convs2s.py)

    def __init__(self, cfg, src_dict, tgt_dict):
        if fairseq_command() in TRAINING_COMMANDS and cfg.distributed_rank == 0:
            save_dir_lock.hold(cfg.save_dir)  # one training per --save-dir (see that module)
        super().__init__(cfg, src_dict, tgt_dict)
        self.interactive_input = InteractiveInput()
        self.vocabulary_selection = None
        self.compiled = CompiledModels(cfg.compile_mode) if cfg.compile else None
        self.bf16_mode = bf16_mode(cfg.autocast_bf16)
        self._bf16 = {}  # device type -> whether the model runs under bf16 autocast there
        if cfg.vocab_rest_clusters < 0:
            raise SelectionOptionError(f"--vocab-rest-clusters ({cfg.vocab_rest_clusters}) must not be "
                                       f"negative: 0 for the softmax over the candidates alone, or a "
                                       f"number of clusters")
        if cfg.beam_step not in BEAM_STEPS:
            raise ValueError(f"--beam-step must be one of {', '.join(BEAM_STEPS)}, got {cfg.beam_step!r}")
        if check_mode(cfg.quantize) != "none" and fairseq_command() in TRAINING_COMMANDS:
            raise QuantizeOptionError("--quantize is for translating (fairseq-generate, fairseq-interactive, "
                                      "the hub); leave it out of training")
        if cfg.quantize != "none" and self.bf16_mode != "off":
            raise QuantizeOptionError("--quantize int8 and --autocast-bf16 are two ways to multiply in lower "
                                      "precision: choose one")
        if cfg.vocab_selection is not None and cfg.beam_step == "stock":
            raise SelectionOptionError("--vocab-selection rides on the lean beam step: leave out --beam-step stock")
        if cfg.vocab_selection is not None:
            self.vocabulary_selection = VocabularySelection.from_file(
                cfg.vocab_selection, src_dict, tgt_dict, cfg.vocab_most_common, cfg.vocab_top_aligned
            )

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        for action in parser._actions:  # present when parsing generation options
            if action.dest == "replace_unk":
                action.const = ""  # utils.load_align_dict: "" = no dictionary, copy

    @classmethod
    def load_dictionary(cls, filename):
        dictionary = super().load_dictionary(filename)
        dictionary.filename = filename  # named when a checkpoint's dictionaries differ
        return dictionary

    def build_model(self, cfg, from_checkpoint=False):
        check_config(copy.deepcopy(cfg), "model")  # checked, not rewritten: checkpoints keep it as given
        return super().build_model(cfg, from_checkpoint)

    @property
    def replaces_unknown_words(self) -> bool:
        return self.cfg.replace_unk is not None

    def load_dataset(self, split, epoch=1, combine=False, **kwargs):
        paths = utils.split_paths(self.cfg.data)
        data_path = paths[(epoch - 1) % len(paths)]
        missing = missing_files(data_path, split, self.cfg.source_lang, self.cfg.target_lang, self.cfg.dataset_impl,
                                target=fairseq_command() != "generate")  # generate translates sources alone
        if missing:
            raise SplitError(missing)
        check_split(data_path, split,  # .idx and .bin agree, ids in the dictionaries
                    {self.cfg.source_lang: len(self.src_dict), self.cfg.target_lang: len(self.tgt_dict)})
        super().load_dataset(split, epoch=epoch, combine=combine, **kwargs)
        if self.replaces_unknown_words:
            self.datasets[split] = self._with_text(split, self.datasets[split])

    def _with_text(self, split, pairs):
        src_lines = raw_lines(pairs.src)
        if src_lines is None:
            raise SourceTextError(
                f"unknown-word replacement needs the words of split {split!r}, which binarized data "
                f"does not keep: pass --dataset-impl raw, which reads {split}.{self.cfg.source_lang}-"
                f"{self.cfg.target_lang}.{self.cfg.source_lang} (and the target side) in "
                f"{utils.split_paths(self.cfg.data)[0]}; convs2s-prepare keeps them there")
        return SourceTextDataset(pairs, src_lines, raw_lines(pairs.tgt))

    def get_batch_iterator(self, dataset, max_tokens=None, max_sentences=None, max_positions=None,
                           ignore_invalid_inputs=False, required_batch_size_multiple=1, **kwargs):
        if dataset is not self.datasets.get(self.cfg.train_subset):
            required_batch_size_multiple = 1  # fairseq would drop a last batch of another size
        if hasattr(dataset, "input_lines") and max_positions is not None and not ignore_invalid_inputs:
            self.interactive_input.report_too_long(dataset, max_positions)
            ignore_invalid_inputs = True
        elif max_positions is not None and not ignore_invalid_inputs:
            self._refuse_too_long(dataset, max_positions)
        epoch = kwargs.pop("epoch", 1)
        kept = (self.can_reuse_epoch_itr(dataset) and not kwargs.get("disable_iterator_cache")
                and not kwargs.get("update_epoch_batch_itr") and not getattr(self.cfg, "rebuild_batches", False))
        made = kept and dataset not in self.dataset_to_epoch_iter
        iterator = super().get_batch_iterator(
            dataset, max_tokens, max_sentences, max_positions, ignore_invalid_inputs,
            required_batch_size_multiple, epoch=1 if kept else epoch, **kwargs,
        )
        if made:  # epoch 1's batches, iterated from the epoch asked for
            iterator.epoch = epoch
        return iterator

    def _refuse_too_long(self, dataset, max_positions):
        """A split of generation or validation with a sentence longer than the model takes is
        refused in one line naming it (:func:`..data.splits.too_long`), where fairseq would stop
        with a traceback."""
        split = next((name for name, loaded in self.datasets.items() if loaded is dataset), None)
        message = split and too_long(dataset, max_positions, utils.split_paths(self.cfg.data)[0], split,
                                     self.cfg.source_lang, self.cfg.target_lang, self.cfg.dataset_impl)
        if message:
            raise SplitError(message)

    def get_interactive_tokens_and_lengths(self, lines, encode_fn):
        return self.interactive_input.read(lines, encode_fn, super().get_interactive_tokens_and_lengths)

    def build_dataset_for_inference(self, src_tokens, src_lengths, constraints=None):
        dataset = super().build_dataset_for_inference(src_tokens, src_lengths, constraints)
        return self.interactive_input.dataset(dataset, src_tokens, with_text=self.replaces_unknown_words)

    def build_generator(self, models, args, seq_gen_cls=None, extra_gen_cls_kwargs=None,
                        prefix_allowed_tokens_fn=None):
        if getattr(args, "score_reference", False) and fairseq_command() == "interactive":
            raise GenerationOptionError(SCORE_REFERENCE_INTERACTIVE)  # no reference to score (see that module)
        quantize_(models, self.cfg.quantize)  # after loading and generation's folds; once
        if seq_gen_cls is None and self.beam_step(models) == "lean":  # fairseq's choice of class, lean
            extra_gen_cls_kwargs = dict(extra_gen_cls_kwargs or {})
            seq_gen_cls = LeanSequenceGenerator
            if getattr(args, "print_alignment", False):
                seq_gen_cls = LeanSequenceGeneratorWithAlignment
                extra_gen_cls_kwargs["print_alignment"] = args.print_alignment
        generator = with_repaired_search(super().build_generator(
            models, args, seq_gen_cls, extra_gen_cls_kwargs, prefix_allowed_tokens_fn
        ), self.target_dictionary)  # fairseq's diverse beam search fails (see that module)
        if self.vocabulary_selection is not None and not getattr(generator, "lean", False):
            raise ValueError(
                "--vocab-selection works with beam search only: leave out --score-reference, "
                "--sampling, --diverse-beam-groups, --diversity-rate, --match-source-len, "
                "--constraints, --no-repeat-ngram-size and --lm-path"
            )
        self.estimate_rest(models)
        replace_unk = getattr(args, "replace_unk", None)
        if replace_unk is None or getattr(args, "score_reference", False):
            return generator
        for model in models:  # fairseq-generate turned attention off unless printing alignments
            if hasattr(model.decoder, "make_generation_fast_"):
                model.decoder.make_generation_fast_(need_attn=True)
        return UnknownWordReplacer(generator, self.source_dictionary, self.target_dictionary,
                                   read_align_dict(replace_unk))

    def estimate_rest(self, models) -> None:
        """With vocabulary selection, each model's W_o estimates the words left out of a
        sentence's candidates (``--vocab-rest-clusters``, ``OutputProjection.estimate_rest``),
        as generation and convs2s-export need; nothing without it."""
        if self.vocabulary_selection is not None:
            for model in models:
                model.decoder.output_projection.estimate_rest(self.vocabulary_selection.always,
                                                              self.cfg.vocab_rest_clusters)

    def beam_step(self, models) -> str:
        """The beam step generation uses for ``models``: ``--beam-step``, where auto is the
        one measured faster on their device (:mod:`fairseq_convs2s_ext.hardware`); always the
        lean one with vocabulary selection, which rides on it."""
        if self.vocabulary_selection is not None:
            return "lean"
        if self.cfg.beam_step != "auto":
            return self.cfg.beam_step
        return fastest("beam step", next(models[0].parameters()).device.type)

    def inference_step(self, generator, models, sample, prefix_tokens=None, constraints=None):
        if isinstance(generator, UnknownWordReplacer) and "src_text" not in sample:
            sample = dict(sample, src_text=self.interactive_input.collated_text(sample))
        if self.vocabulary_selection is not None:
            sample = self.vocabulary_selection.with_candidates(sample, training=False)
        with self._autocast(models[0]):
            hypos = super().inference_step(generator, models, sample, prefix_tokens, constraints)
        hypos = with_empty_translations(sample, hypos, self.source_dictionary, self.target_dictionary)
        return with_decoding_steps(hypos)  # for --print-step

    def _uses_bf16(self, model) -> bool:
        """``--autocast-bf16``'s decision for the model's device, made once (a probe on a CPU)."""
        device = next(model.parameters()).device.type
        if device not in self._bf16:
            self._bf16[device] = choose_bf16(self.bf16_mode, model)
        return self._bf16[device]

    def _autocast(self, model):
        return torch.autocast(device_type=next(model.parameters()).device.type, dtype=torch.bfloat16,
                              enabled=self._uses_bf16(model))

    def train_step(self, sample, model, criterion, optimizer, update_num, ignore_grad=False):
        """fairseq's train_step with the forward pass (only) under ``--autocast-bf16``, the
        batch's candidates with ``--vocab-selection``, the compiled model with ``--compile``."""
        if self.vocabulary_selection is not None:
            sample = self.vocabulary_selection.with_candidates(sample, training=True)
        with self._compiled(model, sample) as model:
            if not self._uses_bf16(model):  # fairseq's, with its --amp
                return super().train_step(sample, model, criterion, optimizer, update_num, ignore_grad)
            model.train()
            model.set_num_updates(update_num)
            with self._autocast(model):
                loss, sample_size, logging_output = criterion(model, sample)
            if ignore_grad:
                loss *= 0
            optimizer.backward(loss)
            return loss, sample_size, logging_output

    def valid_step(self, sample, model, criterion):
        if self.vocabulary_selection is not None:
            sample = self.vocabulary_selection.with_candidates(sample, training=True)
        with self._compiled(model, sample) as model, self._autocast(model):
            return super().valid_step(sample, model, criterion)

    @contextlib.contextmanager
    def _compiled(self, model, sample):
        """``model``, or with ``--compile`` its compiled form, the step's compilation logged."""
        if self.compiled is None:
            yield model
            return
        with self.compiled.step(sample):
            yield self.compiled(model)
