"""fast_align (Dyer et al., 2013) without its binary, the same links on any number of cores:

- :mod:`.fastalign_em` its model (IBM Model 2 with a diagonal prior), trained by EM on every core
- :mod:`.fastalign`    the forward alignment: ``python -m convs2s_preprocess.aligner.fastalign``
                       takes fast_align's options and writes its output
"""
