"""The command-line reference, generated at build time: one page per console script.

A MkDocs hook (``hooks:`` in mkdocs.yml). The list of commands is read from setup.py's
``console_scripts``, and each page holds the ``--help`` text that the command's own entry
point prints: the same argparse parser the installed command uses, so the reference cannot
drift from the code. A command whose ``--help`` fails stops the build; a command added to
setup.py gets a page that is not in mkdocs.yml's nav, which ``mkdocs build --strict`` reports
as a warning (``validation.nav.omitted_files: warn``), so the nav must name it.

Run as a script, it prints each command's name and entry point.
"""
import ast
import contextlib
import importlib
import io
import os
import sys
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WIDTH = "80"  # argparse wraps its help to $COLUMNS; 80 columns fit the page at 1280 px


def console_scripts(setup_py=REPO / "setup.py"):
    """``{command: "module:function"}`` from setup.py's ``entry_points["console_scripts"]``,
    read from its syntax tree (setup.py is not run)."""
    tree = ast.parse(Path(setup_py).read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "entry_points":
            entry_points = ast.literal_eval(node.value)
            pairs = (line.split("=", 1) for line in entry_points.get("console_scripts", []))
            return {name.strip(): target.strip() for name, target in pairs}
    raise ValueError(f"{setup_py}: no entry_points in setup()")


def help_text(command, target):
    """What ``command --help`` prints, from its entry point called as the installed script calls it."""
    module, function = target.split(":")
    with warnings.catch_warnings():  # fairseq's import-time deprecations are not the reader's concern
        warnings.simplefilter("ignore", DeprecationWarning)
        main = getattr(importlib.import_module(module), function)
    out = io.StringIO()
    argv, columns = sys.argv, os.environ.get("COLUMNS")
    sys.argv, os.environ["COLUMNS"] = [command, "--help"], WIDTH
    try:
        with contextlib.redirect_stdout(out):
            main()
    except SystemExit as stop:
        if stop.code not in (0, None):
            raise RuntimeError(f"{command} --help exited with status {stop.code}") from None
    finally:
        sys.argv = argv
        if columns is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = columns
    text = out.getvalue().strip()
    if not text.startswith("usage:"):
        raise RuntimeError(f"{command} --help printed no argparse usage")
    return text


def description(text):
    """The parser's description: the paragraph after the usage, if it is not an option list."""
    paragraphs = text.split("\n\n")
    if len(paragraphs) > 1 and not paragraphs[1].rstrip().endswith(":") and ":\n" not in paragraphs[1]:
        return " ".join(paragraphs[1].split())
    return ""


def command_page(command, target, text):
    return (f"# {command}\n\n"
            f"Entry point `{target}`. Generated from the command's own `--help` when the site is built.\n\n"
            f"```text\n{text}\n```\n")


def index_page(helps):
    rows = "\n".join(f"| [`{c}`]({c}.md) | {description(t) or '&nbsp;'} |" for c, t in helps.items())
    return ("# Command-line reference\n\n"
            "Every console script that `pip install` puts on the PATH, each with the `--help` text\n"
            "its own parser prints (generated when the site is built, so it follows the code).\n"
            "fairseq's own commands (`fairseq-train`, `fairseq-generate`, `fairseq-interactive`,\n"
            "`fairseq-hydra-train`) take the plugin with `--user-dir $(convs2s-user-dir)`; their\n"
            "reference is fairseq's, and with the plugin loaded their `--help` lists the options of the\n"
            "chosen task, architecture and criterion too (`fairseq-train --user-dir $(convs2s-user-dir)\n"
            "--task convs2s_translation --arch convs2s --criterion convs2s_cross_entropy --help`).\n\n"
            "| command | what it does |\n|---|---|\n" + rows + "\n")


def on_files(files, config):
    """MkDocs hook: add ``cli/index.md`` and ``cli/COMMAND.md`` for every console script."""
    from mkdocs.exceptions import PluginError
    from mkdocs.structure.files import File

    helps = {}
    for command, target in console_scripts().items():
        try:
            helps[command] = help_text(command, target)
        except Exception as error:  # noqa: BLE001  (any failure names the command and stops the build)
            raise PluginError(f"CLI reference: {command} ({target}): {error}") from error
        files.append(File.generated(config, f"cli/{command}.md", content=command_page(command, target,
                                                                                      helps[command])))
    files.append(File.generated(config, "cli/index.md", content=index_page(helps)))
    return files


if __name__ == "__main__":
    for name, entry in console_scripts().items():
        print(f"{name}\t{entry}")
