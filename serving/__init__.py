"""Serving a ConvS2S model without fairseq: what ``convs2s-export`` wrote, beam-searched with
torch alone.

- :mod:`.translator`   the exported folder loaded (:class:`ExportedModel`); ids, tokens or raw
                       text in, translations out
- :mod:`.search`  fairseq's beam search, step for step, over the exported decoder step
- :mod:`.output_layer` W_o a batch at a time: every word, or each sentence's candidates
- :mod:`.candidates`   the candidate rule of vocabulary selection (the plugin's too)
- :mod:`.compiled`     the encoder and that step compiled to C++ by AOTInductor
                       (``convs2s-serve --compile``)
- :mod:`.cli`          ``convs2s-serve``
- :mod:`.workers`      processes side by side (``--workers``)
- :mod:`.search_step`  a step's bookkeeping around the model, in two C++ calls
- :mod:`.top_log_probs`, :mod:`.int8_linear`  the C++ kernels of a beam step (:mod:`.kernels`
                       builds them), which the plugin's generation runs too

    from convs2s_serving import ExportedModel, translate
    translate(ExportedModel("exported"), ["A dog runs through the snow."])
"""
import importlib

_EXPORTS = {"ExportedModel": "translator", "translate": "translator", "beam_search": "search",
            "Hypothesis": "search", "SearchOptions": "search"}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
    """The names above, imported on first use: ``convs2s-serve --help`` does not load torch."""
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
