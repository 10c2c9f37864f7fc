"""sacreBLEU of a word-level ConvS2S model on Multi30k en-de test_2016_flickr, with and without
unknown-word replacement (Gehring et al. 2017, word-based models).

    python -m recipes.unk_replacement_bleu --workdir /tmp/unk-bleu            # prepare + train
    python -m recipes.unk_replacement_bleu --workdir /tmp/unk-bleu --checkpoint CKPT

Steps, each with the real command-line tools (a rerun skips the data already prepared and
resumes training):
1. Moses-tokenize the corpus (sacremoses: punctuation normalization, ``-a``, no escaping).
2. ``fairseq-preprocess`` with a word vocabulary of ``--vocab`` words a side, so that rarer
   words become ``<unk>``; each split's tokenized text is written beside its binary files as
   ``{split}.en-de.{lang}.txt``, where ``--task convs2s_translation`` reads it.
3. ``convs2s-align-dict`` (``python -m preprocess.align``, fast_align or eflomal) on the
   tokenized training text: the alignment dictionary.
4. ``fairseq-train --task convs2s_translation --criterion convs2s_cross_entropy`` (NAG,
   lr 0.25, clipping 0.1, label smoothing 0.1, batches of at most 64 sentences), unless
   ``--checkpoint`` is given.
5. ``fairseq-generate`` (beam 5) without and with ``--replace-unk align.dict``, then the
   hypotheses are detokenized and scored with sacreBLEU against the raw references. Without
   replacement each ``<unk>`` is scored as one token that matches nothing (as fairseq's
   ``--eval-bleu`` does).
"""
import argparse
import os
import re
import subprocess
import sys
from itertools import islice
from pathlib import Path
from typing import Dict, List, Optional

from fairseq.utils import load_align_dict

from preprocess.tokenize import detokenize, normalize_and_tokenize
from . import score

SRC, TGT = "en", "de"
SPLITS = {"train": "train", "valid": "val", "test": "test_2016_flickr"}  # ours: Multi30k's
BIN = Path(sys.executable).parent  # the fairseq-* commands beside this interpreter
REPO = Path(__file__).resolve().parents[1]
USER_DIR = REPO / "fairseq_convs2s_ext"
UNSCORED_UNK = "UNKNOWNTOKENINHYP"


def run(cmd, capture=True, **kwargs) -> str:
    """Run a command; its output (shown instead when not ``capture``), or an error."""
    cmd = [str(c) for c in cmd]
    output = subprocess.PIPE if capture else None
    proc = subprocess.run(cmd, stdout=output, stderr=subprocess.STDOUT if capture else None,
                          text=True, **kwargs)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{(proc.stdout or '')[-4000:]}")
    return proc.stdout


def tokenize(in_path: Path, out_path: Path, lang: str, limit: Optional[int] = None) -> None:
    """The first ``limit`` lines of ``in_path`` (all by default), as convs2s-prepare tokenizes."""
    with open(in_path, encoding="utf-8") as f, open(out_path, "w", encoding="utf-8") as out:
        for line in islice(f, limit):
            out.write(normalize_and_tokenize(line.strip(), lang) + "\n")


def prepare_data(workdir: Path, corpus: Path, vocab: int, lines: Optional[Dict[str, int]] = None) -> Path:
    """Steps 1 and 2: tokenized text in workdir/tok, binarized data in workdir/bin; ``lines``
    keeps the first N sentences of a split ({"train": 3000}), all by default."""
    tok, data = workdir / "tok", workdir / "bin"
    tok.mkdir(parents=True, exist_ok=True)
    for split, name in SPLITS.items():
        for lang in (SRC, TGT):
            if not (tok / f"{split}.{lang}").exists():
                tokenize(corpus / f"{name}.{lang}", tok / f"{split}.{lang}", lang,
                         (lines or {}).get(split))
    if not (data / f"dict.{TGT}.txt").exists():
        run([BIN / "fairseq-preprocess", "--source-lang", SRC, "--target-lang", TGT,
             "--trainpref", tok / "train", "--validpref", tok / "valid", "--testpref", tok / "test",
             "--destdir", data, "--nwordssrc", vocab, "--nwordstgt", vocab, "--workers", 2])
    for split in SPLITS:
        for lang in (SRC, TGT):
            text = data / f"{split}.{SRC}-{TGT}.{lang}"
            if not text.exists():
                text.write_bytes((tok / f"{split}.{lang}").read_bytes())
    return data


def build_align_dict(workdir: Path) -> Path:
    """Step 3: workdir/align.dict from the tokenized training text."""
    out = workdir / "align.dict"
    if not out.exists():
        run([sys.executable, "-m", "preprocess.align", "--src", workdir / "tok" / f"train.{SRC}",
             "--tgt", workdir / "tok" / f"train.{TGT}", "-o", out], cwd=REPO)
    return out


def train(data: Path, save_dir: Path, arch: str, max_epoch: int, *options) -> Path:
    """Step 4: the best checkpoint of a word-level model trained on ``data`` (fairseq-train
    resumes from ``save_dir``'s last checkpoint, and stops at once when it is complete)."""
    run([BIN / "fairseq-train", data, "--user-dir", USER_DIR, "--task", "convs2s_translation",
         "--arch", arch, "--criterion", "convs2s_cross_entropy", "--label-smoothing", 0.1,
         "--optimizer", "nag", "--lr", 0.25, "--clip-norm", 0.1,
         "--lr-scheduler", "reduce_lr_on_plateau", "--lr-shrink", 0.1,
         "--max-epoch", max_epoch, "--save-dir", save_dir, "--no-epoch-checkpoints",
         "--seed", 1, "--log-format", "simple", *options], capture=False)
    return save_dir / "checkpoint_best.pt"


def generate(data: Path, checkpoint: Path, *options) -> Dict[int, Dict[str, str]]:
    """fairseq-generate on the test split: {sentence id: {"S": source, "T": ..., "H": ...}}."""
    out = run([BIN / "fairseq-generate", data, "--user-dir", USER_DIR,
               "--task", "convs2s_translation", "--path", checkpoint, "--beam", 5,
               "--batch-size", 128, *options])
    lines: Dict[int, Dict[str, str]] = {}
    for match in re.finditer(r"^([STH])-(\d+)\t(.*)$", out, re.MULTILINE):
        kind, index, text = match.groups()
        if kind == "H":
            text = text.split("\t", 1)[1]  # after the score
        lines.setdefault(int(index), {})[kind] = text
    return lines


def count_replacements(plain, replaced, align: Dict[str, str]):
    """How many <unk> of the plain hypotheses became a dictionary translation of a source
    word, and how many a copy (as fairseq-generate printed them: same ids, same length)."""
    by_dictionary = copied = 0
    for i, lines in plain.items():
        translations = {align[w] for w in replaced[i]["S"].split() if w in align}
        for before, after in zip(lines["H"].split(), replaced[i]["H"].split()):
            if before == "<unk>":
                by_dictionary += after in translations
                copied += after not in translations
    return by_dictionary, copied


def sacrebleu_score(hypotheses: List[str], references: List[str]) -> float:
    return score.bleu([detokenize(h.replace("<unk>", UNSCORED_UNK), TGT) for h in hypotheses], references)["score"]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, required=True, help="where data and model go")
    parser.add_argument("--corpus", type=Path, help="Multi30k folder (default: "
                        "$CONVS2S_DATA/multi30k, else ../shared/data/multi30k)")
    parser.add_argument("--vocab", type=int, default=4000, help="words a side (default 4000)")
    parser.add_argument("--train-lines", type=int, help="first N training pairs (default all)")
    parser.add_argument("--arch", default="convs2s_iwslt_de_en")
    parser.add_argument("--max-epoch", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=4000,
                        help="batch token limit; batches hold at most 64 sentences (section 4)")
    parser.add_argument("--checkpoint", type=Path, help="score this model instead of training "
                        "one (trained on this workdir's data: the same dictionaries)")
    args = parser.parse_args(argv)

    data_root = Path(os.environ.get("CONVS2S_DATA", REPO.parent / "shared" / "data"))
    corpus = args.corpus or data_root / "multi30k"
    data = prepare_data(args.workdir, corpus, args.vocab, {"train": args.train_lines})
    align_dict = build_align_dict(args.workdir)
    checkpoint = args.checkpoint or train(data, args.workdir / "checkpoints", args.arch,
                                          args.max_epoch, "--max-tokens", args.max_tokens,
                                          "--batch-size", 64)
    references = (corpus / f"{SPLITS['test']}.{TGT}").read_text(encoding="utf-8").splitlines()
    plain = generate(data, checkpoint)
    replaced = generate(data, checkpoint, "--replace-unk", align_dict)
    for output in (plain, replaced):
        score.check_counts(output, references, "fairseq-generate", corpus / f"{SPLITS['test']}.{TGT}")
    ids = range(len(references))
    words = sum(len(plain[i]["H"].split()) for i in ids)
    by_dictionary, copied = count_replacements(plain, replaced, load_align_dict(str(align_dict)))
    unknowns = by_dictionary + copied
    print(f"model: {checkpoint}; test: {len(references)} sentences, {unknowns} of {words} "
          f"hypothesis words <unk> ({100 * unknowns / max(words, 1):.1f}%), replaced by "
          f"{by_dictionary} dictionary translations and {copied} copies")
    for name, output in (("without replacement:", plain), ("with --replace-unk:", replaced)):
        bleu = sacrebleu_score([output[i]["H"] for i in ids], references)
        print(f"sacreBLEU {name:21} {bleu:.2f}")


if __name__ == "__main__":
    main()
