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
