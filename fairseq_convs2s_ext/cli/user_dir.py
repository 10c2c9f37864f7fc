"""``convs2s-user-dir``: print the folder to pass to fairseq's ``--user-dir``.

With the package installed, ``fairseq-train --user-dir "$(convs2s-user-dir)" ...`` works
from any directory.
"""
import argparse

from .. import USER_DIR


def main(argv=None):
    argparse.ArgumentParser(
        prog="convs2s-user-dir",
        description="Print the folder of the ConvS2S plugin, for fairseq's --user-dir: "
                    'fairseq-train --user-dir "$(convs2s-user-dir)" ... works from any directory.',
    ).parse_args(argv)
    print(USER_DIR)


if __name__ == "__main__":
    main()
