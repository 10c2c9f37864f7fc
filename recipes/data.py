"""``convs2s-data --where``: print the data folder the recipes and tests read corpora from.

The rule is :func:`convs2s_recipes.corpora.data_root`'s: ``CONVS2S_DATA`` (the Makefile's
``DATA=``), else ``../shared/data`` (beside the current folder) where it exists, else the user's
cache folder (``$XDG_CACHE_HOME/convs2s`` or ``~/.cache/convs2s``).
"""
import argparse

from .corpora import data_root


def main(argv=None):
    parser = argparse.ArgumentParser(prog="convs2s-data", description=__doc__.split("\n\n")[0])
    parser.add_argument("--where", action="store_true", required=True,
                        help="print the data folder in use (where missing corpora are downloaded to): "
                             "CONVS2S_DATA, else ../shared/data (beside the current folder) where it exists, "
                             "else $XDG_CACHE_HOME/convs2s or ~/.cache/convs2s")
    parser.parse_args(argv)
    print(data_root())


if __name__ == "__main__":
    main()
