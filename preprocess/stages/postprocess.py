"""``convs2s-postprocess``: model output -> plain text, for detokenized BLEU (section 4).

Undoes the pipeline on translations: BPE removal (``sed -r 's/(@@ )|(@@ ?$)//g'``) and
Moses detokenization, reading stdin and writing stdout like Sennrich's
``postprocess-test.sh``, e.g.
``fairseq-generate ... | grep ^H | sort -V | cut -f3 | convs2s-postprocess -l de``.
"""
import argparse
import sys
from typing import Optional

from .bpe import remove_bpe
from .tokenize import detokenize


def postprocess(line: str, lang: str, bpe: bool = True) -> str:
    """Remove BPE markers (unless ``bpe`` is False) and detokenize one line."""
    return detokenize(remove_bpe(line) if bpe else line, lang)


def parse_args(argv: Optional[list] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="convs2s-postprocess",
        description="Remove BPE and detokenize translations (stdin -> stdout).")
    parser.add_argument("-l", "--lang", required=True, help="language of the text")
    parser.add_argument("--no-bpe", action="store_true", help="the text has no BPE markers")
    return parser.parse_args(argv)


def main(argv: Optional[list] = None) -> None:
    args = parse_args(argv)
    sys.stdin.reconfigure(encoding="utf-8")
    sys.stdout.reconfigure(encoding="utf-8")
    for line in sys.stdin:
        print(postprocess(line.rstrip("\r\n"), args.lang, bpe=not args.no_bpe))


if __name__ == "__main__":
    main()
