"""``convs2s-translate``: translate a file of raw text, as a server would.

    convs2s-translate --path checkpoints/checkpoint_best.pt --data data -i news.en -o news.de
    convs2s-translate --path checkpoints/checkpoint_best.pt --data data --quantize int8 < news.en

Each line is normalized and tokenized as ``convs2s-prepare`` prepared the training text (its
record in ``--data``, ``prepare.json``, says whether the Romanian steps were on), segmented
with the folder's BPE codes, translated by fairseq's SequenceGenerator in batches of sentences
of similar length (the hub's batching; with the plugin's lean beam step, and ``--quantize``,
``--vocab-selection`` and ``--replace-unk`` as in fairseq-generate), and detokenized. The
translations come out in the input's order, a line each; an empty line stays empty. It reads
``--chunk`` lines at a time, so memory does not grow with the file. With ``-o`` the file
appears whole once everything is translated, never half-written. At the end it prints on
stderr the sentences it translated, the time they took and the sentences per second
(tokenizing and detokenizing counted, loading the model not).

It runs on the threads the plugin's commands choose (``OMP_NUM_THREADS``, else the idle cores:
:mod:`..threads`). ``--workers N`` translates in N processes of a share of those threads each,
side by side, a batch at a time each (:mod:`..models.hub_workers`): the same translations, more
sentences a second on a CPU; each worker holds a copy of the model.

The hub (``ConvS2SModel.from_pretrained``) runs the same generator: from Python, translate
token lists of your own with ``hub.translate``; this command adds the tokenization of the
prepared folder, the file handling and the figures.
"""
import argparse
import contextlib
import functools
import itertools
import json
import os
import sys
import time
from concurrent.futures.process import BrokenProcessPool

import torch

from convs2s_preprocess.runtime.atomic import atomic_file
from convs2s_preprocess.stages.tokenize import detokenize, normalize_and_tokenize
from convs2s_serving.workers import WORKER_DIED

from ..excepthook import install_excepthook
from ..generation.quantization import QUANTIZE_MODES
from ..generation.unknown_words import AlignDictError, read_align_dict
from ..models.hub_interface import SentenceTooLong
from ..models.hub_workers import HubWorkers
from ..threads import apply_to_command as choose_command_threads


def parser():
    p = argparse.ArgumentParser(
        prog="convs2s-translate",
        description="Translate raw text, a sentence a line, with a trained ConvS2S model: tokenized and "
                    "segmented as convs2s-prepare prepared its data, batched by length, detokenized.")
    p.add_argument("--path", required=True, help="checkpoint file (checkpoints/checkpoint_best.pt; a.pt:b.pt "
                                                 "for an ensemble of checkpoints in one folder)")
    p.add_argument("--data", required=True, help="the folder convs2s-prepare wrote for the model")
    p.add_argument("-i", "--input", default="-", help="raw text, a sentence a line (default: stdin)")
    p.add_argument("-o", "--output", default="-", help="the translations, a line each (default: stdout)")
    p.add_argument("--beam", type=int, default=5, help="beam size (default: %(default)s)")
    p.add_argument("--lenpen", type=float, default=1.0, help="length penalty, as fairseq-generate's")
    p.add_argument("--batch-size", type=int, default=128, help="sentences a batch (default: %(default)s)")
    p.add_argument("--chunk", type=int, default=10000,
                   help="lines read, sorted by length and translated at a time (default: %(default)s)")
    p.add_argument("--quantize", choices=QUANTIZE_MODES, default="none",
                   help="int8: the decoders' linear layers multiply in int8 (CPU; see docs/translating.md)")
    p.add_argument("--vocab-selection", metavar="CANDIDATES",
                   help="score only each sentence's candidate words (convs2s-align-dict --candidates)")
    p.add_argument("--replace-unk", nargs="?", const="", metavar="ALIGN_DICT",
                   help="replace <unk> with the attended source word, or its translation in ALIGN_DICT")
    p.add_argument("--workers", type=int, default=1,
                   help="processes translating side by side on the CPU, the threads shared out among them "
                        "(default: %(default)s; see docs/translating.md)")
    p.add_argument("--cpu", action="store_true", help="translate on the CPU even where a GPU is available")
    return p


def prepared_record(data):
    """What ``convs2s-prepare`` recorded in ``data`` (its options), or {} for a folder it did not write."""
    path = os.path.join(data, "prepare.json")
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def main(argv=None):
    args = parser().parse_args(argv)
    install_excepthook()  # a checkpoint or file that cannot be used: one line
    error = check(args)
    if error:
        sys.exit(f"convs2s-translate: error: {error}")
    threads = choose_command_threads().count
    options = dict(tokenizer="space", quantize=args.quantize, batch_size=args.batch_size,
                   beam=args.beam, lenpen=args.lenpen)
    if args.vocab_selection:
        options["vocab_selection"] = os.path.abspath(args.vocab_selection)
    hub_args = (os.path.dirname(os.path.abspath(args.path)), os.path.basename(args.path), os.path.abspath(args.data))
    try:
        translator = HubWorkers(args.workers, *hub_args, threads=max(1, threads // args.workers), **options)
    except (FileNotFoundError, ValueError) as e:
        sys.exit(f"convs2s-translate: error: {e}")
    except BrokenProcessPool:
        sys.exit(f"convs2s-translate: error: {WORKER_DIED}")
    if args.workers == 1 and torch.cuda.is_available() and not args.cpu:
        translator.hub.cuda()
    source, target = translator.hub.task.cfg.source_lang, translator.hub.task.cfg.target_lang
    romanian = prepared_record(args.data).get("romanian", False) and source == "ro"
    sentences, seconds = 0, 0.0
    where = "stdin" if args.input == "-" else args.input
    try:
        with _opened(args.input) as lines, _opened(args.output, writing=True) as out:
            for chunk in _chunks(lines, args.chunk):
                start = time.perf_counter()
                translations = translator.translate(
                    [line.rstrip("\r\n") for line in chunk], beam=args.beam, lenpen=args.lenpen,
                    replace_unk=args.replace_unk, preprocess=functools.partial(normalize_and_tokenize, lang=source,
                                                                               romanian=romanian),
                    postprocess=functools.partial(detokenize, lang=target))
                seconds += time.perf_counter() - start
                out.writelines(t + "\n" for t in translations)
                sentences += len(chunk)
    except UnicodeDecodeError as e:
        sys.exit(f"convs2s-translate: error: {where}: not UTF-8 text (byte {e.start} of line "
                 f"{sentences + 1} or after): convert it first, e.g. iconv -t UTF-8; {written(args, sentences)}")
    except SentenceTooLong as e:  # its line in the file: the hub counts within the chunk
        sys.exit(f"convs2s-translate: error: {where}: {e.named(f'line {sentences + e.index + 1}')}; "
                 f"{written(args, sentences)}")
    except ValueError as e:  # the hub's: its message names what is wrong (a --replace-unk dictionary's line)
        sys.exit(f"convs2s-translate: error: {e}; {written(args, sentences)}")
    except BrokenProcessPool:
        sys.exit(f"convs2s-translate: error: {WORKER_DIED}; {written(args, sentences)}")
    finally:
        translator.close()
    rate = f": {sentences / seconds:.1f} sentences/s" if seconds else ""
    each = translator.threads
    threads_text = f"{each} thread{'s' if each > 1 else ''}"
    if args.workers > 1:
        threads_text = f"{args.workers} workers of {threads_text}"
    print(f"convs2s-translate: {sentences:,} sentences in {seconds:.1f} s{rate} (beam {args.beam}, batches of "
          f"{args.batch_size}, {threads_text}{', int8' if args.quantize == 'int8' else ''}; loading the model "
          "not counted)", file=sys.stderr)
    return 0


def check(args):
    """The first problem with the command line's files, or None."""
    if not os.path.isfile(args.path.split(":")[0]):
        what = "a folder, not a checkpoint" if os.path.isdir(args.path) else "no such checkpoint file"
        return f"{args.path}: {what}: --path takes a file, e.g. checkpoints/checkpoint_best.pt"
    if args.input != "-" and not os.path.isfile(args.input):
        return f"{args.input}: no such file: -i takes a text file, a sentence a line (or leave it out for stdin)"
    if args.output != "-" and os.path.isdir(args.output):
        return f"{args.output}: a folder: -o takes the file to write"
    if args.replace_unk:  # a bad one refused before the model loads (the hub reads it at each chunk)
        try:
            read_align_dict(args.replace_unk)
        except AlignDictError as e:
            return str(e)
    if args.workers > 1 and torch.cuda.is_available() and not args.cpu:
        return f"--workers {args.workers} translates on the CPU: add --cpu (or leave --workers out for the GPU)"
    for name in ("beam", "batch_size", "chunk", "workers"):
        if getattr(args, name) < 1:
            return f"--{name.replace('_', '-')} must be at least 1, not {getattr(args, name)}"
    return None


def written(args, sentences):
    """What a failed run left written, the end of its error line: a file is written whole or
    not at all; stdout has the translations of the chunks done before the failure."""
    if args.output != "-" or sentences == 0:
        return "nothing was written"
    return f"stdout has the translations of lines 1-{sentences} only"


def _chunks(lines, size):
    lines = iter(lines)
    while chunk := list(itertools.islice(lines, size)):
        yield chunk


@contextlib.contextmanager
def _opened(path, writing=False):
    """stdin or stdout for "-", else the file: read as UTF-8, or written beside ``path`` and
    renamed to it when the block ends (never half-written, nothing left if the block fails)."""
    if path == "-":
        stream = sys.stdout if writing else sys.stdin
        stream.reconfigure(encoding="utf-8")
        yield stream
        stream.flush()
    elif writing:
        with atomic_file(path) as temp, open(temp, "w", encoding="utf-8") as f:
            yield f
    else:
        with open(path, encoding="utf-8") as f:
            yield f


if __name__ == "__main__":
    sys.exit(main())
