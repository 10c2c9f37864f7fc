"""What convs2s-prepare does to the text, one stage per module, in the pipeline's order:

- :mod:`.tokenize`    Moses punctuation normalization, tokenization, detokenization
- :mod:`.romanian`    WMT16 Romanian normalization and diacritic removal
- :mod:`.clean`       training-pair filter (empty, too long, length ratio)
- :mod:`.bpe`         joint BPE with subword-nmt, and its removal
- :mod:`.binarize`    ``fairseq-preprocess``'s output with fairseq's binarizer, every core busy
- :mod:`.align`       ``convs2s-align-dict``: the unknown-word replacement dictionary and the
                      vocabulary-selection candidates, from fast_align's links
- :mod:`.postprocess` ``convs2s-postprocess``: remove BPE and detokenize translations
"""
