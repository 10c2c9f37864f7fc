"""``convs2s-serve``: translate a file with a model ``convs2s-export`` wrote, without fairseq.

    convs2s-export --path checkpoints/checkpoint_best.pt --data data -o exported
    convs2s-serve exported -i news.en -o news.de
    convs2s-serve exported --tokens < news.bpe.en      # tokens in (BPE'd), tokens out

Raw text is normalized and tokenized as ``convs2s-prepare`` prepared the model's data,
segmented with its BPE codes, translated (:mod:`.translator`) and detokenized, a line each in
the input's order. With ``-o`` the file appears whole once everything is translated. At the
end it prints on stderr the sentences, the time they took and the sentences per second
(loading the model and the tokenizer not counted). ``--workers N`` translates in N processes
side by side, which tokenize and detokenize too.
"""
import argparse
import contextlib
import logging
import os
import sys
import time
from concurrent.futures.process import BrokenProcessPool

from convs2s_preprocess.runtime.atomic import atomic_file

from .workers import WORKER_DIED


def parser():
    p = argparse.ArgumentParser(
        prog="convs2s-serve",
        description="Translate raw text, a sentence a line, with a model convs2s-export wrote: torch alone, "
                    "no fairseq. The hypotheses are the plugin's (float32, beam search as fairseq-generate's).")
    p.add_argument("model", help="the folder convs2s-export wrote")
    p.add_argument("-i", "--input", default="-", help="raw text, a sentence a line (default: stdin)")
    p.add_argument("-o", "--output", default="-", help="the translations, a line each (default: stdout)")
    p.add_argument("--tokens", action="store_true",
                   help="the input is tokenized and BPE'd as the model's data, and so is the output")
    p.add_argument("--beam", type=int, default=5, help="beam size (default: %(default)s)")
    p.add_argument("--lenpen", type=float, default=1.0, help="length penalty, as fairseq-generate's")
    p.add_argument("--max-len-a", type=float, default=0.0, help="as fairseq-generate's (default: %(default)s)")
    p.add_argument("--max-len-b", type=int, default=200, help="as fairseq-generate's (default: %(default)s)")
    p.add_argument("--min-len", type=int, default=1, help="as fairseq-generate's (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=128, help="sentences a batch (default: %(default)s)")
    p.add_argument("--compile", action="store_true",
                   help="run the encoder and the decoder's step compiled to C++ by torch's AOTInductor: built on "
                        "first use (tens of seconds, kept in $CONVS2S_SERVING_CACHE or ~/.cache/convs2s-serving), "
                        "then faster, most of all for small batches")
    p.add_argument("--workers", type=int, default=1,
                   help="translate in this many processes side by side, torch's threads shared out among them, "
                        "each batch taken by whichever is free: on a CPU, often faster than one process of all the "
                        "threads, most of all for small batches (default: %(default)s)")
    p.add_argument("--no-vocab-selection", action="store_true",
                   help="score every word of the vocabulary, where the model was exported with vocabulary "
                        "selection (convs2s-export --vocab-selection), which scores each sentence's candidates only")
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    error = _check(args)
    if error:
        sys.exit(f"convs2s-serve: error: {error}")
    from .translator import ExportedModel

    compiled_log = logging.getLogger("convs2s_serving.compiled")
    if args.compile and not compiled_log.handlers:  # building the libraries takes a while: say so, and when done
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("convs2s-serve: %(message)s"))
        compiled_log.addHandler(handler)
        compiled_log.setLevel(logging.INFO)
    try:
        model = ExportedModel(args.model, compile=args.compile, vocabulary_selection=not args.no_vocab_selection,
                              workers=args.workers)
    except (FileNotFoundError, ValueError) as e:
        sys.exit(f"convs2s-serve: error: {e}")
    except BrokenProcessPool:
        sys.exit(f"convs2s-serve: error: {WORKER_DIED}")
    with model:
        return _serve(args, model)


def _serve(args, model):
    """Translate the input with ``model`` (loaded) and write it, as :func:`main` is asked."""
    import torch

    from .translator import load_text_processing, translate

    if not args.tokens and model.pool is None:  # loading, not translating: not in the time printed
        load_text_processing(model)
    try:
        with _opened(args.input) as f:
            lines = [line.rstrip("\r\n") for line in f]
    except UnicodeDecodeError as e:
        sys.exit(f"convs2s-serve: error: {args.input}: not UTF-8 text (byte {e.start}): convert it first, "
                 "e.g. iconv -t UTF-8; nothing was written")
    options = dict(beam=args.beam, lenpen=args.lenpen, max_len_a=args.max_len_a, max_len_b=args.max_len_b,
                   min_len=args.min_len)
    start = time.perf_counter()
    try:
        if args.tokens:
            out = [" ".join(t) for t in model.translate_tokens([line.split() for line in lines], args.batch_size,
                                                               **options)]
        else:
            out = translate(model, lines, args.batch_size, **options)
    except ValueError as e:
        sys.exit(f"convs2s-serve: error: {args.input}: {e}; nothing was written")
    except BrokenProcessPool:
        sys.exit(f"convs2s-serve: error: {WORKER_DIED}; nothing was written")
    seconds = time.perf_counter() - start
    if args.output == "-":
        sys.stdout.reconfigure(encoding="utf-8")
        sys.stdout.writelines(line + "\n" for line in out)
    else:
        with atomic_file(args.output) as temp, open(temp, "w", encoding="utf-8") as f:
            f.writelines(line + "\n" for line in out)
    rate = f": {len(lines) / seconds:.1f} sentences/s" if seconds else ""
    threads = f"{torch.get_num_threads()} threads" if args.workers == 1 else \
        f"{args.workers} workers of {model.threads} thread{'s' * (model.threads > 1)}"
    print(f"convs2s-serve: {len(lines):,} sentences in {seconds:.1f} s{rate} (beam {args.beam}, batches of "
          f"{args.batch_size}, {threads}; loading not counted)", file=sys.stderr)
    return 0


def _check(args):
    if not os.path.isdir(args.model):
        return f"{args.model}: no such folder: give the folder convs2s-export wrote"
    if args.input != "-" and not os.path.isfile(args.input):
        return f"{args.input}: no such file: -i takes a text file, a sentence a line (or leave it out for stdin)"
    if args.output != "-" and os.path.isdir(args.output):
        return f"{args.output}: a folder: -o takes the file to write"
    for name in ("beam", "batch_size", "workers"):
        if getattr(args, name) < 1:
            return f"--{name.replace('_', '-')} must be at least 1, not {getattr(args, name)}"
    return None


@contextlib.contextmanager
def _opened(path):
    if path == "-":
        sys.stdin.reconfigure(encoding="utf-8")
        yield sys.stdin
    else:
        with open(path, encoding="utf-8") as f:
            yield f


if __name__ == "__main__":
    sys.exit(main())
