"""Empty sources translate to empty sentences.

An empty source (an empty input line of fairseq-interactive, an empty line of a test set) is
the end-of-sentence marker alone, from which the model would invent a sentence; its
translation is the end-of-sentence marker alone, with score 0.
"""
import torch


def with_empty_translations(sample, hypos, source_dictionary, target_dictionary):
    """``hypos`` (fairseq's n-best lists of ``sample``'s sentences) with one empty hypothesis
    (end of sentence alone, score 0) for each empty source."""
    src_tokens = sample["net_input"]["src_tokens"]
    words = src_tokens.ne(source_dictionary.pad()) & src_tokens.ne(source_dictionary.eos())
    for i in (~words.any(dim=1)).nonzero().flatten().tolist():
        eos = torch.tensor([target_dictionary.eos()], device=src_tokens.device)
        hypos[i] = [{"tokens": eos, "score": torch.tensor(0.0), "attention": None, "alignment": None,
                     "positional_scores": torch.zeros(1, device=src_tokens.device)}]
    return hypos
