"""Multi30k en-de with joint BPE, binarized for fairseq, in a cache folder outside the repo.

Moses tokenization (sacremoses, ``-a``, no escaping), ``--merges`` joint BPE merges
learned with subword-nmt's Python API on the tokenized train set, then
``fairseq-preprocess --joined-dictionary``. The result is keyed by the options, so a
second run reuses it; a half-written folder is never reused (it is renamed into place
when complete).
"""
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SPLITS = {"train": "train", "valid": "val", "test": "test_2016_flickr"}


def data_root():
    return Path(os.environ.get("CONVS2S_DATA", REPO.parent / "shared" / "data"))


def cache_root():
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "convs2s-bench"


def prepare(src="en", tgt="de", merges=10000):
    """Return the fairseq data-bin folder for Multi30k src-tgt, building it if needed."""
    corpus = data_root() / "multi30k"
    for split in SPLITS.values():
        for lang in (src, tgt):
            if not (corpus / f"{split}.{lang}").exists():
                raise SystemExit(f"missing {corpus / f'{split}.{lang}'}: set CONVS2S_DATA to the shared data folder")
    key = hashlib.sha1(f"multi30k {src}-{tgt} moses-a bpe{merges} v1".encode()).hexdigest()[:10]
    out = cache_root() / f"multi30k-{src}-{tgt}-bpe{merges}-{key}"
    if (out / "bin" / f"dict.{tgt}.txt").exists():
        return out / "bin"
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    try:
        _build(corpus, work, src, tgt, merges)
        if out.exists():
            shutil.rmtree(out)
        work.rename(out)
    finally:
        if work.exists():
            shutil.rmtree(work)
    return out / "bin"


def _build(corpus, work, src, tgt, merges):
    from sacremoses import MosesTokenizer
    from subword_nmt.apply_bpe import BPE
    from subword_nmt.learn_bpe import learn_bpe

    print(f"preparing Multi30k {src}-{tgt} with {merges} BPE merges in {work.parent}", file=sys.stderr)
    tok = {}
    for lang in (src, tgt):
        moses = MosesTokenizer(lang)
        for name, split in SPLITS.items():
            with open(corpus / f"{split}.{lang}", encoding="utf-8") as f:
                tok[name, lang] = [
                    moses.tokenize(line.strip(), aggressive_dash_splits=True, escape=False, return_str=True)
                    for line in f
                ]
    codes = work / "codes"
    with open(codes, "w", encoding="utf-8") as f:
        learn_bpe(tok["train", src] + tok["train", tgt], f, merges)
    with open(codes, encoding="utf-8") as f:
        bpe = BPE(f)
    for (name, lang), lines in tok.items():
        with open(work / f"{name}.{lang}", "w", encoding="utf-8") as f:
            f.writelines(bpe.process_line(line) + "\n" for line in lines)
    subprocess.run(
        [sys.executable, "-m", "fairseq_cli.preprocess", "--source-lang", src, "--target-lang", tgt,
         "--trainpref", str(work / "train"), "--validpref", str(work / "valid"), "--testpref", str(work / "test"),
         "--destdir", str(work / "bin"), "--joined-dictionary", "--workers", "2"],
        check=True, stdout=subprocess.DEVNULL,
    )


if __name__ == "__main__":
    print(prepare())
