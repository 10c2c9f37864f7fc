"""Scoring of a recipe's output: detokenized sacreBLEU, tokenized BLEU, or ROUGE.

The hypotheses must be exactly as many as the references: fairseq's batching can drop
sentences silently, and a score over a subset would be wrong without anyone noticing.
"""
import sacrebleu


# A hypothesis's <unk> is scored as this one word, which matches no reference word (as fairseq's
# --eval-bleu does); detokenized, "<unk>" would be three words for sacreBLEU's tokenizer.
UNSCORED_UNK = "UNKNOWNTOKENINHYP"


class ScoreError(Exception):
    pass


def check_counts(hypotheses, references, hyp_source, ref_source):
    if len(hypotheses) != len(references):
        raise ScoreError(
            f"{len(hypotheses)} hypotheses ({hyp_source}) for {len(references)} references ({ref_source}): "
            "every test sentence must be translated; generate with --required-batch-size-multiple 1 and "
            "without --skip-invalid-size-inputs-valid-test"
        )


def read_lines(path, f):
    """The lines of ``f`` (bytes; ``path`` names it), each without its newline; a ScoreError
    naming the file and the line where one is not UTF-8 (Python's names neither)."""
    lines = []
    for number, raw in enumerate(f, 1):
        try:
            lines.append(raw.decode("utf-8").rstrip("\n"))
        except UnicodeDecodeError as e:
            raise ScoreError(f"{path}: line {number} is not UTF-8 ({e.reason} at byte {e.start} of the line: "
                             f"{raw[e.start:e.start + 4]!r}): convert the file, e.g. iconv -f ISO-8859-1 -t UTF-8 "
                             f"(with its real encoding)") from None
    return lines


def bleu(hypotheses, references, tokenized=False):
    """sacreBLEU; ``tokenized=True`` scores Moses-tokenized text as is (multi-bleu.perl's
    tokenized BLEU, which the paper reports for WMT'14)."""
    metric = sacrebleu.BLEU(tokenize="none", force=True) if tokenized else sacrebleu.BLEU()
    result = metric.corpus_score(hypotheses, [references])
    return {"score": round(result.score, 2), "text": str(result), "signature": str(metric.get_signature())}


def rouge(hypotheses, references):
    """ROUGE-1/2/L F1 (Google's rouge-score package, the ``gigaword`` extra)."""
    try:
        from rouge_score import rouge_scorer, scoring
    except ImportError:
        raise ScoreError("ROUGE needs the rouge-score package: pip install -e '.[gigaword]'") from None
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"])
    aggregator = scoring.BootstrapAggregator()
    for hyp, ref in zip(hypotheses, references):
        aggregator.add_scores(scorer.score(ref, hyp))
    return {name: round(100 * value.mid.fmeasure, 2) for name, value in aggregator.aggregate().items()}


def generated_hypotheses(lines):
    """The best hypothesis of each sentence, in sentence order, from fairseq-generate's or
    fairseq-interactive's output (its ``D-`` lines, or ``H-`` where there are none: the text
    after BPE removal and detokenization where generation had ``--post-process``/``--tokenizer``);
    None if ``lines`` are not such output (plain text, one hypothesis a line)."""
    found = {"D": {}, "H": {}}
    for line in lines:
        kind, _, rest = line.partition("-")
        if kind in found and "\t" in rest and rest.split("\t", 1)[0].isdigit():
            key, _, text = rest.rstrip("\n").split("\t", 2)
            found[kind].setdefault(int(key), text)  # the first (best) of n-best
    best = found["D"] or found["H"]
    return [best[i] for i in sorted(best)] if best else None


def main(argv=None):
    """``convs2s-score``: sacreBLEU of translations against raw references, where
    ``fairseq-score --sacrebleu`` fails (it hands sacreBLEU a file object for the references)."""
    import argparse
    import sys

    from convs2s_preprocess.stages.postprocess import postprocess

    p = argparse.ArgumentParser(
        prog="convs2s-score",
        description="Detokenized sacreBLEU of translations against raw (untokenized) references: "
                    "fairseq-generate's output or plain text, one hypothesis a line.")
    p.add_argument("-r", "--ref", required=True, help="the references, raw text, one sentence a line")
    p.add_argument("-s", "--sys", default="-",
                   help="the translations: fairseq-generate/fairseq-interactive output (its D- lines, in "
                        "sentence order) or plain text (default: stdin)")
    p.add_argument("-l", "--detokenize", metavar="LANG",
                   help="remove BPE and Moses-detokenize the translations first (for output of a "
                        "generation without --tokenizer moses --bpe ...)")
    p.add_argument("--tokenized", action="store_true",
                   help="score tokenized text as is (multi-bleu.perl's tokenized BLEU) instead of sacreBLEU's 13a")
    args = p.parse_args(argv)
    try:
        with open(args.ref, "rb") as f:
            references = read_lines(args.ref, f)
        if args.sys == "-":
            lines = read_lines("stdin", sys.stdin.buffer)
        else:
            with open(args.sys, "rb") as f:
                lines = read_lines(args.sys, f)
        if not lines:
            raise ScoreError(f"{'stdin' if args.sys == '-' else args.sys}: empty, no translations: did the "
                             f"generation fail? (see its log)")
        hypotheses = generated_hypotheses(lines)
        if hypotheses is None:
            hypotheses = lines
        if args.detokenize:
            hypotheses = [postprocess(h, args.detokenize) for h in hypotheses]
        check_counts(hypotheses, references, args.sys, args.ref)
    except (OSError, ScoreError) as e:
        message = f"{e.filename}: {e.strerror}" if isinstance(e, OSError) and e.filename else e
        print(f"convs2s-score: error: {message}", file=sys.stderr)
        return 1
    result = bleu(hypotheses, references, tokenized=args.tokenized)
    print(result["text"])
    print(result["signature"])
    return 0
