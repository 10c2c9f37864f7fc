"""Data preparation for ConvS2S (Gehring et al., 2017, section 4), independent of the model.

Sennrich et al.'s WMT16 pipeline, laid out by what each part is:

- :mod:`.pipeline`  ``convs2s-prepare``: the stages in order, each an atomic step
- :mod:`.stages`    what is done to the text: tokenize, clean, learn and apply BPE, binarize,
                    the alignment dictionary, and postprocessing of translations
- :mod:`.aligner`   fast_align's model and its forward alignment, without its binary
- :mod:`.runtime`   how it runs unattended: a process pool that cannot hang, line-by-line work
                    on every core, atomic steps, shards a rerun reuses, locks, progress, child
                    processes, what the host offers
- :mod:`.textio`    UTF-8 line I/O with errors naming file and line
- :mod:`.errors`    the one-line error every command prints instead of a traceback
"""
