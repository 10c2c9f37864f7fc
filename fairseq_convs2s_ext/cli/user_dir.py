"""``convs2s-user-dir``: print the folder to pass to fairseq's ``--user-dir``.

With the package installed, ``fairseq-train --user-dir "$(convs2s-user-dir)" ...`` works
from any directory.
"""
import os


def main():
    print(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the package, above cli/


if __name__ == "__main__":
    main()
