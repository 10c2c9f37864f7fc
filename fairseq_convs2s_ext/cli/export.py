"""``convs2s-export``: a trained model as a folder that ``convs2s-serve`` translates with, without
fairseq (:mod:`..generation.export` says what the folder holds).

    convs2s-export --path checkpoints/checkpoint_best.pt --data data -o exported [--quantize int8] \
        [--vocab-selection data/candidates]
    convs2s-serve exported < news.en > news.de
"""
import argparse
import os
import sys

from ..excepthook import install_excepthook
from ..generation.export import export
from ..generation.quantization import QUANTIZE_MODES
from ..models.hub_interface import binarized_folder, bpe_codes, from_pretrained
from ..tasks.convs2s_translation import ConvS2STranslationConfig
from .translate import prepared_record


def parser():
    p = argparse.ArgumentParser(
        prog="convs2s-export",
        description="Export a trained ConvS2S model for convs2s-serve (torch alone, no fairseq): its encoder and "
                    "decoder step as torch.export programs, its vocabularies, languages and BPE codes.")
    p.add_argument("--path", required=True, help="checkpoint file (checkpoints/checkpoint_best.pt)")
    p.add_argument("--data", required=True, help="the folder convs2s-prepare wrote for the model (or its bin/)")
    p.add_argument("-o", "--output", required=True, help="the folder to write (replaced if it exists)")
    p.add_argument("--quantize", choices=QUANTIZE_MODES, default="none",
                   help="int8: the linear layers multiply in int8, as fairseq-generate --quantize int8 (CPU)")
    defaults = ConvS2STranslationConfig()
    p.add_argument("--vocab-selection", metavar="CANDIDATES",
                   help="vocabulary selection: the candidates file (convs2s-align-dict --candidates) that "
                        "fairseq-generate --vocab-selection takes; convs2s-serve then scores each sentence's "
                        "candidates only")
    p.add_argument("--vocab-most-common", type=int, default=defaults.vocab_most_common, metavar="N",
                   help="as fairseq-generate's (default: %(default)s)")
    p.add_argument("--vocab-top-aligned", type=int, default=defaults.vocab_top_aligned, metavar="K",
                   help="as fairseq-generate's (default: %(default)s)")
    p.add_argument("--vocab-rest-clusters", type=int, default=defaults.vocab_rest_clusters, metavar="N",
                   help="as fairseq-generate's (default: %(default)s)")
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    install_excepthook()  # a checkpoint or folder that cannot be used: one line
    if not os.path.isfile(args.path):
        what = "a folder, not a checkpoint" if os.path.isdir(args.path) else "no such checkpoint file"
        sys.exit(f"convs2s-export: error: {args.path}: {what}: --path takes a file, e.g. checkpoints/checkpoint_best.pt")
    if os.path.exists(args.output) and not os.path.isdir(args.output):
        sys.exit(f"convs2s-export: error: {args.output}: a file: -o takes the folder to write")
    selection = {} if args.vocab_selection is None else dict(
        vocab_selection=os.path.abspath(args.vocab_selection), vocab_most_common=args.vocab_most_common,
        vocab_top_aligned=args.vocab_top_aligned, vocab_rest_clusters=args.vocab_rest_clusters)
    try:
        hub = from_pretrained(os.path.dirname(os.path.abspath(args.path)), os.path.basename(args.path),
                              os.path.abspath(args.data), tokenizer="space", quantize=args.quantize, **selection)
    except (FileNotFoundError, ValueError) as e:
        sys.exit(f"convs2s-export: error: {e}")
    if len(hub.models) != 1:
        sys.exit("convs2s-export: error: --path names one checkpoint: an ensemble is not exported")
    task = hub.task
    task.estimate_rest(hub.models)
    export(hub.models[0], args.output, (task.cfg.source_lang, task.cfg.target_lang),
           bpe_codes(binarized_folder(os.path.abspath(args.data))),
           prepared_record(args.data).get("romanian", False), task.vocabulary_selection)
    print(f"convs2s-export: wrote {args.output} (translate with: convs2s-serve {args.output} < input.txt)",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
