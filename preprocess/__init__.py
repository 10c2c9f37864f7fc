"""Data preparation for ConvS2S (Gehring et al., 2017, section 4), independent of the model.

Sennrich et al.'s WMT16 pipeline, one concept per module:

- :mod:`.tokenize`    Moses punctuation normalization, tokenization, detokenization
- :mod:`.romanian`    WMT16 Romanian normalization and diacritic removal
- :mod:`.clean`       training-pair filter (empty, too long, length ratio)
- :mod:`.bpe`         joint BPE with subword-nmt, and its removal
- :mod:`.binarize`    ``fairseq-preprocess``'s output with fairseq's binarizer, every core busy
- :mod:`.atomic`      atomic steps that rebuild when their inputs or options change
- :mod:`.textio`      UTF-8 line I/O with errors naming file and line
- :mod:`.pipeline`    ``convs2s-prepare``: all of the above in order
- :mod:`.align`       ``convs2s-align-dict``: unknown-word replacement dictionary
- :mod:`.fastalign`   fast_align's forward alignment, without its binary
- :mod:`.fastalign_em` fast_align's model, trained on every core, the same for any number
- :mod:`.parallel`    line-by-line stages on every core, in order, in bounded memory
- :mod:`.shards`      the finished parts of a step's output that a rerun after a kill reuses
- :mod:`.progress`    a long stage's progress as log lines: rate and time left
- :mod:`.runtime`     the one parallel runtime: a process pool that ends whatever the load
                      and whenever a signal arrives
- :mod:`.processes`   child processes that stop with the command that started them
- :mod:`.host`        what the machine offers: usable cores, the default worker count, the
                      cache folder, a process tree (standard library only)
- :mod:`.postprocess` ``convs2s-postprocess``: remove BPE and detokenize translations
"""
