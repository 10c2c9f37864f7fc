"""Let fairseq-generate replace unknown words in binarized data for ``convs2s_translation``.

``fairseq_cli.generate.main`` asserts ``--dataset-impl raw`` whenever ``--replace-unk`` is
given ("--replace-unk requires a raw text dataset"), because fairseq's binarized datasets keep
no words. ``convs2s_translation`` keeps them beside the binary files (see
:mod:`.source_text`), so for that task the assertion is wrong. It runs before any task hook
could intervene, so :func:`install` replaces ``main`` with :func:`main`, which runs fairseq's
own ``main`` for every other task (and for ours without ``--replace-unk``), and otherwise the
same steps without that one assertion. The rest of generation is fairseq's ``_main``.

Installed when the plugin is imported, which ``--user-dir`` does while the command line is
parsed, before ``main`` is called. This covers the ``fairseq-generate`` command and
``python -m fairseq_cli.generate`` (whose module runs as ``__main__``).
"""
import os
import sys
from argparse import Namespace

import fairseq_cli.generate as stock
from fairseq.dataclass.utils import convert_namespace_to_omegaconf

TASK = "convs2s_translation"
_stock_main = stock.main


def main(cfg):
    if isinstance(cfg, Namespace):
        cfg = convert_namespace_to_omegaconf(cfg)
    if getattr(cfg.task, "_name", None) != TASK or cfg.generation.replace_unk is None:
        return _stock_main(cfg)
    # fairseq_cli.generate.main without its assertion on --dataset-impl raw
    assert cfg.common_eval.path is not None, "--path required for generation!"
    assert (
        not cfg.generation.sampling or cfg.generation.nbest == cfg.generation.beam
    ), "--sampling requires --nbest to be equal to --beam"
    if cfg.common_eval.results_path is None:
        return stock._main(cfg, sys.stdout)
    os.makedirs(cfg.common_eval.results_path, exist_ok=True)
    output_path = os.path.join(cfg.common_eval.results_path, f"generate-{cfg.dataset.gen_subset}.txt")
    with open(output_path, "w", buffering=1, encoding="utf-8") as h:
        return stock._main(cfg, h)


def install():
    """Make fairseq-generate call :func:`main`."""
    stock.main = main
    script = sys.modules.get("__main__")
    if getattr(getattr(script, "__spec__", None), "name", None) == stock.__name__:
        script.main = main
