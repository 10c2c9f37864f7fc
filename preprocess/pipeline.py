"""``convs2s-prepare``: raw parallel text -> fairseq binarized data (paper section 4).

Sennrich's WMT16 pipeline as the paper uses it, one atomic step each that knows what it
was built from (see :mod:`preprocess.atomic`)::

    normalize punctuation [+ Romanian normalization] + Moses tokenize -a   (every split)
    clean: drop empty, > --max-len tokens, length ratio > --ratio          (train only)
    learn joint BPE (--bpe-merges, default 40000) and apply it             (or --no-bpe)
    binarize as fairseq-preprocess --joined-dictionary, every core busy    (binarize)
    with --align-dict: convs2s-align-dict on the training text that is binarized, in a
    process of its own that starts as soon as that text is written and runs beside the
    steps after it (BPE of the other splits, binarizing), with the same --workers

Layout of the output directory::

    tok/{train,valid,test}.LANG    normalized, tokenized text
    tok/train.clean.LANG           cleaned training text (input of convs2s-align-dict)
    bpe/codes, bpe/SPLIT.LANG      BPE codes and segmented text (not with --no-bpe)
    bin/                           fairseq-preprocess output: dict.LANG.txt, *.bin, *.idx,
                                   and, for valid and test, SPLIT.SRC-TGT.LANG: the text that
                                   was binarized, which fairseq reads as the split's raw text
                                   (--dataset-impl raw, needed by --replace-unk)
                                   (read by convs2s_translation for --replace-unk)
    align.dict, align.candidates   with --align-dict: the alignment dictionary and the
                                   vocabulary-selection candidates (convs2s-align-dict)
    prepare.json                   the options of the last complete run (a summary only)
    .NAME.built-from.json          beside each step's first output: what it was built from
    .NAME.shards/                  while tokenizing, applying BPE, binarizing or aligning
                                   runs: the finished shards of output NAME (see below;
                                   removed once the step is done)

Rerunning the command reuses every step that is current and rebuilds, saying why, every
step whose inputs' contents or options changed, and after it each step whose own inputs
came out different. So an interrupted run resumes where it stopped; a raw corpus replaced
in place is tokenized, cleaned, segmented and binarized again; and other options on the
same directory rebuild only what they affect (other ``--bpe-merges``: BPE and binarization,
not tokenization and cleaning). Files that the new options no longer produce (``bpe/``
after ``--no-bpe``, ``tok/test.*`` without ``--testpref``) are left as they were.

Within a step, tokenizing, applying BPE and binarizing resume too: they write each file in
shards of 1,000,000 input lines (``CONVS2S_SHARD_LINES``), each complete or absent, in
``.NAME.shards/`` beside the output NAME, and a rerun after a kill reuses the finished ones
if they were derived from the same input, options and shard size (it logs ``tokenize
PATH: resuming: N of M shards already done``; anything else discards them all, logged as
``not resuming``), so a kill loses at most the shards in progress, not hours of
tokenization (:mod:`preprocess.shards`); binarizing keeps its dictionaries there too, and
the builtin aligner of ``--align-dict`` its trained model and its links (see
:mod:`preprocess.align`). The folders are removed once the step's outputs are in place:
until then a step needs about twice its outputs' disk. Cleaning and learning BPE start over
when interrupted.
"""
import argparse
import contextlib
import json
import logging
import os
import shutil
import sys
from importlib.metadata import version
from typing import Optional

from .stages.align import build_align_dict, find_aligner
from .runtime.atomic import atomic_outputs, run_step
from .stages.binarize import binarize
from .stages.bpe import DEFAULT_MAX_WORDS, DEFAULT_MERGES, DEFAULT_SAMPLE, apply_bpe_file, learn_joint_bpe
from .stages.clean import DEFAULT_MAX_LEN, DEFAULT_RATIO, clean_corpus
from .errors import PreprocessError, full_disk_reported
from .runtime.locking import output_lock
from .runtime.host import default_workers
from .runtime.processes import exit_on_sigterm
from .runtime.pool import beside
from .textio import check_parallel, sample_option
from .stages.tokenize import tokenize_file

logger = logging.getLogger(__name__)

SUMMARY_FILE = "prepare.json"
ALIGN_DICT, ALIGN_CANDIDATES = "align.dict", "align.candidates"


def write_summary(outdir: str, options: dict) -> None:
    """Record in ``outdir/prepare.json`` the options of its last complete preparation."""
    path, text = os.path.join(outdir, SUMMARY_FILE), json.dumps(options, indent=2, sort_keys=True)
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            if f.read() == text:
                return
    with atomic_outputs([path]) as (temp,):
        with open(temp, "w", encoding="utf-8") as f:
            f.write(text)


def _tokenize_pair(raw: list, langs: tuple, romanian: bool, workers: int,
                   *tok_outputs: str) -> None:
    check_parallel(*raw)
    for in_path, out_path, lang in zip(raw, tok_outputs, langs):
        tokenize_file(in_path, out_path, lang, romanian=romanian and lang == "ro",
                      workers=workers)


def _apply_bpe_pair(codes: str, inputs: list, outputs: tuple, workers: int) -> None:
    for in_path, out_path in zip(inputs, outputs):
        apply_bpe_file(codes, in_path, out_path, workers)


def prepare(outdir: str, src_lang: str, tgt_lang: str, trainpref: str,
            validpref: Optional[str] = None, testpref: Optional[str] = None,
            romanian: bool = False, bpe_merges: Optional[int] = DEFAULT_MERGES,
            max_len: int = DEFAULT_MAX_LEN, ratio: Optional[float] = DEFAULT_RATIO,
            srcdict: Optional[str] = None, joined_dictionary: bool = True,
            nwords: int = -1, workers: Optional[int] = None,
            bpe_sample: int = DEFAULT_SAMPLE, bpe_max_words: int = DEFAULT_MAX_WORDS,
            align_dict: bool = False, tmpdir: Optional[str] = None) -> str:
    """Run every step that is not current; return the binarized data directory.

    Input files are ``PREFIX.LANG``. ``bpe_merges=None`` keeps word-level tokens,
    ``ratio=None`` switches the length-ratio filter off, ``romanian`` applies the WMT16
    Romanian normalization to the ``ro`` side. ``workers``: processes per stage, by default
    the cores this process may use. ``bpe_sample``: learn BPE from at most this many
    training pairs, spread over the corpus (0: from every pair); ``bpe_max_words``: from a
    smaller sample where those pairs hold more distinct words than this (0: no bound).
    ``align_dict``: also build ``align.dict`` and ``align.candidates`` from the training text
    that is binarized, beside the steps after it, the aligner's work folder in ``tmpdir``
    (default: ``outdir``).
    """
    workers = default_workers(workers)
    aligner = find_aligner() if align_dict else None  # none installed: said before any work
    if tmpdir and not os.path.isdir(tmpdir):
        raise PreprocessError(f"--tmpdir {tmpdir}: no such folder; create it or give another")
    langs = (src_lang, tgt_lang)
    if romanian and "ro" not in langs:
        raise PreprocessError(f"--romanian needs 'ro' as source or target language, got {langs}")
    prefixes = {split: os.path.abspath(prefix) for split, prefix in
                (("train", trainpref), ("valid", validpref), ("test", testpref)) if prefix}

    def files(prefix: str) -> list:
        return [f"{prefix}.{lang}" for lang in langs]

    tok = {split: os.path.join(outdir, "tok", split) for split in prefixes}
    for split, prefix in prefixes.items():
        raw = files(prefix)
        run_step(f"tokenize {split}", raw, files(tok[split]),
                 lambda *out, raw=raw: _tokenize_pair(raw, langs, romanian, workers, *out),
                 {"langs": langs, "romanian": romanian, "sacremoses": version("sacremoses")})

    cleaned = os.path.join(outdir, "tok", "train.clean")
    text = dict(tok, train=cleaned)
    run_step("clean train", files(tok["train"]), files(cleaned),
             lambda *out: clean_corpus(*files(tok["train"]), *out, max_len, ratio, workers=workers),
             {"max_len": max_len, "ratio": ratio})

    alignment = contextlib.ExitStack()

    def align_beside(prefix: str) -> None:
        """Build the alignment dictionary of the training text ``prefix`` beside what follows."""
        if aligner:
            alignment.enter_context(beside(
                "alignment dictionary", build_align_dict, *files(prefix),
                os.path.join(outdir, ALIGN_DICT), aligner,
                os.path.join(outdir, ALIGN_CANDIDATES), workers, None, tmpdir))

    with alignment:
        if bpe_merges:
            codes = os.path.join(outdir, "bpe", "codes")
            subword_nmt = {"subword-nmt": version("subword-nmt")}
            run_step("learn BPE", files(text["train"]), [codes],
                     lambda out: learn_joint_bpe(files(text["train"]), out, bpe_merges, workers,
                                                 bpe_sample, bpe_max_words),
                     {"merges": bpe_merges, "max_words": bpe_max_words, **subword_nmt,
                      **sample_option("sample", bpe_sample, files(text["train"])[0])})
            segmented = {split: os.path.join(outdir, "bpe", split) for split in prefixes}
            for split in prefixes:  # train first
                inputs = files(text[split])
                run_step(f"apply BPE {split}", [codes] + inputs, files(segmented[split]),
                         lambda *out, inputs=inputs: _apply_bpe_pair(codes, inputs, out, workers),
                         subword_nmt)
                if split == "train":
                    align_beside(segmented[split])
            text = segmented
        else:
            align_beside(text["train"])

        bindir = os.path.join(outdir, "bin")

        def binarize_with_text(out: str) -> None:
            binarize(out, src_lang, tgt_lang, trainpref=text["train"],
                     validpref=text.get("valid"), testpref=text.get("test"),
                     srcdict=srcdict, joined_dictionary=joined_dictionary,
                     nwords=nwords, workers=workers)
            # The evaluation splits' text beside the binaries, named as fairseq's raw-text
            # datasets: --dataset-impl raw reads it (with the same ids as the binaries) and
            # keeps the words, which --replace-unk needs. Not the training text: fairseq
            # would then load the training split as raw text, which is slow for large corpora.
            for split, prefix in text.items():
                for lang in langs:
                    if split != "train":
                        shutil.copyfile(f"{prefix}.{lang}",
                                        os.path.join(out, f"{split}.{src_lang}-{tgt_lang}.{lang}"))

        run_step("binarize", [path for prefix in text.values() for path in files(prefix)]
                 + ([srcdict] if srcdict else []), [bindir], binarize_with_text,
                 {"langs": langs, "splits": list(text), "srcdict": bool(srcdict),
                  "joined_dictionary": joined_dictionary, "nwords": nwords})
    write_summary(outdir, {
        "langs": list(langs), "prefixes": prefixes, "romanian": romanian,
        "bpe_merges": bpe_merges, "max_len": max_len, "ratio": ratio,
        "srcdict": srcdict and os.path.abspath(srcdict),
        "joined_dictionary": joined_dictionary, "nwords": nwords, "align_dict": align_dict,
    })
    if aligner:
        logger.info("done: binarized data in %s; alignment dictionary %s, candidates %s",
                    bindir, *(os.path.join(outdir, name) for name in (ALIGN_DICT, ALIGN_CANDIDATES)))
    else:
        logger.info("done: binarized data in %s; tokenized training text for "
                    "convs2s-align-dict: %s", bindir, " ".join(files(cleaned)))
    raw_text = ["--tokenizer", "moses", "--moses-no-escape", "-s", src_lang, "-t", tgt_lang]
    if bpe_merges:
        raw_text += ["--bpe", "subword_nmt", "--bpe-codes", os.path.join(outdir, "bpe", "codes")]
    logger.info("to translate untokenized text with a model trained on it: fairseq-interactive %s "
                '--user-dir "$(convs2s-user-dir)" --task convs2s_translation --path CHECKPOINT %s',
                bindir, " ".join(raw_text))
    return bindir


def parse_args(argv: Optional[list] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="convs2s-prepare",
        description="Tokenize, clean, BPE-encode and binarize a parallel corpus for ConvS2S "
                    "(files PREFIX.LANG). Rerun to resume, or to update the outputs after "
                    "the inputs or options changed: only the steps affected run again.")
    parser.add_argument("-s", "--source-lang", required=True,
                        help="source language: the suffix of the input files (PREFIX.LANG), e.g. en")
    parser.add_argument("-t", "--target-lang", required=True,
                        help="target language: the suffix of the input files (PREFIX.LANG), e.g. de")
    parser.add_argument("--trainpref", required=True, help="raw training text prefix")
    parser.add_argument("--validpref", help="raw validation text prefix")
    parser.add_argument("--testpref", help="raw test text prefix")
    parser.add_argument("-o", "--outdir", required=True, help="output directory")
    parser.add_argument("--romanian", action="store_true",
                        help="WMT16 Romanian normalization and diacritic removal on the ro side")
    bpe = parser.add_mutually_exclusive_group()
    bpe.add_argument("--bpe-merges", type=int, default=DEFAULT_MERGES, metavar="N",
                     help=f"joint BPE merge operations (default {DEFAULT_MERGES})")
    bpe.add_argument("--no-bpe", action="store_true", help="word-level vocabulary, no BPE")
    parser.add_argument("--bpe-sample", type=int, default=DEFAULT_SAMPLE, metavar="N",
                        help=f"learn BPE from at most N training pairs spread evenly over the "
                             f"corpus: learning the merges takes a time and memory that grow "
                             f"with the vocabulary (default {DEFAULT_SAMPLE}; 0: every pair)")
    parser.add_argument("--bpe-max-words", type=int, default=DEFAULT_MAX_WORDS, metavar="N",
                        help=f"learn BPE from at most N distinct words: from an evenly spread "
                             f"sample of the training pairs that holds no more, where the corpus "
                             f"does; learning holds about 1.5 KiB per word, so the default keeps "
                             f"it near 6 GiB whatever the corpus (default {DEFAULT_MAX_WORDS}; "
                             f"0: no bound)")
    parser.add_argument("--max-len", type=int, default=DEFAULT_MAX_LEN,
                        help=f"drop training pairs with a side longer than this many tokens "
                             f"(default {DEFAULT_MAX_LEN})")
    ratio = parser.add_mutually_exclusive_group()
    ratio.add_argument("--ratio", type=float, default=DEFAULT_RATIO,
                       help=f"drop training pairs whose length ratio exceeds this "
                            f"(default {DEFAULT_RATIO})")
    ratio.add_argument("--no-ratio", action="store_true", help="no length-ratio filter")
    parser.add_argument("--srcdict", help="reuse this fairseq dictionary (joined)")
    parser.add_argument("--separate-dictionaries", action="store_true",
                        help="one dictionary per language instead of --joined-dictionary")
    parser.add_argument("--nwords", type=int, default=-1,
                        help="vocabulary size cap (word-level models); -1: keep all")
    parser.add_argument("--workers", type=int,
                        help="parallel processes (default: the cores this process may use)")
    parser.add_argument("--align-dict", action="store_true",
                        help="also build OUTDIR/align.dict and OUTDIR/align.candidates "
                             "(convs2s-align-dict's defaults) from the training text that is "
                             "binarized, in a process that runs beside the steps after it")
    parser.add_argument("--tmpdir", metavar="DIR",
                        help="with --align-dict: where the aligner's work folder goes (a copy of "
                             "the training text and its links; default: OUTDIR)")
    args = parser.parse_args(argv)
    if args.tmpdir and not args.align_dict:
        parser.error("--tmpdir is the aligner's work folder: give it with --align-dict")
    if args.bpe_sample < 0:
        parser.error(f"--bpe-sample {args.bpe_sample}: give a number of pairs, or 0 for all")
    if args.bpe_max_words < 0:
        parser.error(f"--bpe-max-words {args.bpe_max_words}: give a number of words, or 0 for no bound")
    if args.workers is not None and args.workers < 1:
        parser.error(f"--workers {args.workers}: give at least 1 (or leave it out: the cores available)")
    return args


def main(argv: Optional[list] = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s | %(message)s")
    exit_on_sigterm()
    try:
        with full_disk_reported(args.outdir), output_lock(args.outdir):
            prepare(args.outdir, args.source_lang, args.target_lang, args.trainpref,
                    args.validpref, args.testpref, romanian=args.romanian,
                    bpe_merges=None if args.no_bpe else args.bpe_merges, max_len=args.max_len,
                    ratio=None if args.no_ratio else args.ratio, srcdict=args.srcdict,
                    joined_dictionary=not args.separate_dictionaries, nwords=args.nwords,
                    workers=args.workers, bpe_sample=args.bpe_sample,
                    bpe_max_words=args.bpe_max_words,
                    align_dict=args.align_dict, tmpdir=args.tmpdir)
    except PreprocessError as exc:
        sys.exit(f"error: {exc}")
    except KeyboardInterrupt:
        sys.exit(f"interrupted: the finished steps and shards in {args.outdir} are kept; "
                 "run the same command again to go on from them")


if __name__ == "__main__":
    main()
