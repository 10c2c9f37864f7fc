"""``convs2s-user-dir``: print the folder to pass to fairseq's ``--user-dir``.

With the package installed, ``fairseq-train --user-dir "$(convs2s-user-dir)" --task
convs2s_translation ...`` works from any directory: fairseq reads a relative ``--user-dir``
from the current folder. (The recipes' configs, for fairseq-hydra-train's ``--config-dir``, are
printed by ``convs2s-recipe --config-dir``.) The plugin is found, not imported: importing it
loads fairseq (seconds), which ``$(convs2s-user-dir)`` in front of every command would repeat.
"""
import argparse
import importlib.util
import os


def user_dir() -> str:
    """The plugin's folder, ``fairseq_convs2s_ext.USER_DIR``, without importing the plugin."""
    spec = importlib.util.find_spec("fairseq_convs2s_ext")
    return os.path.abspath(spec.submodule_search_locations[0])


def main(argv=None):
    argparse.ArgumentParser(
        prog="convs2s-user-dir",
        description="Print the folder of the ConvS2S plugin, for fairseq's --user-dir: "
                    'fairseq-train --user-dir "$(convs2s-user-dir)" --task convs2s_translation ... works '
                    "from any directory. The recipes' configs, for fairseq-hydra-train --config-dir: "
                    "convs2s-recipe --config-dir.",
    ).parse_args(argv)
    print(user_dir())


if __name__ == "__main__":
    main()
