"""Each sentence's candidate target words (vocabulary selection in generation), in torch alone:
the rule the plugin's generation applies (``fairseq_convs2s_ext.data.vocabulary_selection``
says where it comes from and why) and an exported model's runtime applies to the tables
``convs2s-export --vocab-selection`` wrote.

A sentence's candidates are the words every sentence has (:data:`always`: the special symbols,
then the most common words) and the words aligned to its source words (``aligned``: a row of
target ids per source id, padded with a special symbol). They are a row each, the specials at
their own ids, so that local column i of a row stands for word ``row[i]``
(:func:`candidates_per_sentence`). The words left out of a sentence's candidates may count in
its softmax's normaliser, a column per cluster of W_o's rows (:func:`rest_log_counts`).
"""
import torch

NO_WORD = -1  # pads the rows of per-sentence candidates
# A word that 1 in COMMON_SHARE of a batch's sentences have is scored for every hypothesis
# (masked where its sentence lacks it): a matrix multiply's column for every hypothesis costs
# a fraction of a column of the sentences' own rows, which are read from memory at every step
# for a sentence's few hypotheses only (bench/README.md as of 86165d7~, the run of 4e76217).
COMMON_SHARE = 4


def candidates_per_sentence(aligned: torch.Tensor, always: torch.Tensor, vocabulary_size: int,
                            src_tokens: torch.Tensor) -> torch.Tensor:
    """Each sentence's candidates, a row each (B x C). First come the words that the output
    layer scores for every hypothesis of the batch, each at the same column in every row: the
    specials and the most common words (``always``, in id order), then the other words that at
    least 1 in :data:`COMMON_SHARE` of the sentences have, in id order, with :data:`NO_WORD`
    in the rows of the sentences without them. Then each sentence's other words in id order,
    padded with :data:`NO_WORD` to the longest row. A sentence alone has every word in common
    with its batch: the specials and the most common words, then its other words in id order
    (:func:`_one_sentence`, the same row in a third of the time)."""
    if src_tokens.size(0) == 1:
        return _one_sentence(aligned, always, vocabulary_size, src_tokens[0])
    return _batch(aligned, always, vocabulary_size, src_tokens)


def _one_sentence(aligned, always, vocabulary_size, src_tokens):
    """:func:`candidates_per_sentence` of one sentence (a 1 x C row): a translation server's
    batch, set up before every sentence's search (5 operations where the batch's rule takes
    some twenty: 24 against 68 us, one thread, AMD EPYC)."""
    chosen = torch.zeros(vocabulary_size, dtype=torch.bool, device=src_tokens.device)
    chosen[aligned[src_tokens].view(-1).long()] = True
    chosen[always] = False
    return torch.cat([always, chosen.nonzero().squeeze(1)]).unsqueeze(0)


def _batch(aligned, always, vocabulary_size, src_tokens):
    """:func:`candidates_per_sentence` of any number of sentences."""
    sentences = src_tokens.size(0)
    chosen = torch.zeros(sentences, vocabulary_size, dtype=torch.bool, device=src_tokens.device)
    chosen.scatter_(1, aligned[src_tokens].view(sentences, -1).long(), True)
    chosen[:, always] = False
    common = (chosen.sum(0) * COMMON_SHARE >= sentences).nonzero().squeeze(1)
    head = torch.cat([always.expand(sentences, -1), torch.where(chosen[:, common], common, NO_WORD)], dim=1)
    chosen[:, common] = False
    counts = chosen.sum(1)
    rows, words = chosen.nonzero(as_tuple=True)  # row by row, each row's words in order
    columns = torch.arange(rows.numel(), device=rows.device) - (counts.cumsum(0) - counts)[rows]
    others = torch.full((sentences, int(counts.max())), NO_WORD, dtype=torch.long, device=rows.device)
    others[rows, columns] = words
    return torch.cat([head, others], dim=1)


def shared_columns(candidates: torch.Tensor):
    """The leading columns of ``candidates`` (B x C) that hold one word in every row, or none
    (:data:`NO_WORD`): their words' ids (NO_WORD as 0) and how many they are. The output
    layer scores them for every hypothesis with one product. A sentence alone shares every
    column."""
    if len(candidates) == 1:
        return candidates[0].clamp(min=0), candidates.size(1)
    return _shared_of_batch(candidates)


def _shared_of_batch(candidates):
    """:func:`shared_columns` of any number of rows."""
    word = candidates.max(0).values  # of each column, where a row has one
    one_word = ((candidates == word) | (candidates < 0)).all(0)
    width = int(one_word.cumprod(0).sum())
    return word[:width].clamp(min=0), width


def cluster_sizes(labels: torch.Tensor, count: int) -> torch.Tensor:
    """How many words each of the ``count`` clusters of W_o's rows holds (``labels``: a cluster
    id per word, -1 for the words every sentence has): once a model, not once a batch (a pass
    over the vocabulary, most of :func:`rest_log_counts`' time for one sentence)."""
    return torch.bincount(labels[labels >= 0], minlength=count)


def rest_log_counts(labels: torch.Tensor, sizes: torch.Tensor, candidates: torch.Tensor, dtype) -> torch.Tensor:
    """For each sentence of ``candidates`` (B x C) and each cluster of W_o's rows (``labels``: a
    cluster id per word, -1 for the words every sentence has; ``sizes``: their
    :func:`cluster_sizes`), the log of how many of the cluster's words the sentence's
    candidates leave out (-inf where none): B x clusters, in ``dtype``."""
    labels = labels.to(candidates.device)
    cluster = labels[candidates.clamp(min=0)]
    taken = torch.zeros(len(candidates), len(sizes), dtype=dtype, device=candidates.device)
    taken.scatter_add_(1, cluster.clamp(min=0), ((candidates >= 0) & (cluster >= 0)).to(dtype))
    return (sizes.to(device=candidates.device, dtype=dtype) - taken).log()
