"""Binarization of the BPE (or word-level) text with ``fairseq-preprocess``.

fairseq's standard data preparation for ConvS2S: builds the dictionary (one dictionary
shared by both languages with ``--joined-dictionary``, the natural choice for joint BPE,
or reuses ``--srcdict``) and writes ``dict.*.txt`` and the ``*.bin``/``*.idx`` datasets
that ``fairseq-train`` reads. It runs as a subprocess (``python -m fairseq_cli.preprocess``
with this interpreter, which is what the ``fairseq-preprocess`` script runs); a failure
raises with fairseq's own output.
"""
import shlex
import subprocess
import sys
from typing import Optional

from .errors import PreprocessError

# Lines of fairseq's output quoted in the error message when it fails.
ERROR_TAIL_LINES = 40


def preprocess_command(destdir: str, src_lang: str, tgt_lang: str,
                       trainpref: Optional[str] = None, validpref: Optional[str] = None,
                       testpref: Optional[str] = None, srcdict: Optional[str] = None,
                       joined_dictionary: bool = True, nwords: int = -1,
                       workers: int = 1) -> list:
    """The ``fairseq-preprocess`` command line for these files and options.

    ``nwords`` caps the (joined) vocabulary, for word-level models; -1 keeps every word.
    """
    cmd = [sys.executable, "-m", "fairseq_cli.preprocess",
           "--source-lang", src_lang, "--target-lang", tgt_lang,
           "--destdir", destdir, "--workers", str(workers)]
    for option, prefix in (("--trainpref", trainpref), ("--validpref", validpref),
                           ("--testpref", testpref), ("--srcdict", srcdict)):
        if prefix:
            cmd += [option, prefix]
    if joined_dictionary:
        cmd.append("--joined-dictionary")
    if nwords > 0:
        # With --joined-dictionary fairseq sizes the shared dictionary by --nwordssrc.
        cmd += ["--nwordssrc", str(nwords), "--nwordstgt", str(nwords)]
    return cmd


def binarize(destdir: str, src_lang: str, tgt_lang: str, **options) -> None:
    """Run ``fairseq-preprocess`` into ``destdir``; options as in :func:`preprocess_command`."""
    cmd = preprocess_command(destdir, src_lang, tgt_lang, **options)
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        tail = "\n".join(proc.stdout.splitlines()[-ERROR_TAIL_LINES:])
        raise PreprocessError(
            f"fairseq-preprocess failed with exit status {proc.returncode}:\n"
            f"  {shlex.join(cmd)}\n{tail}"
        )
