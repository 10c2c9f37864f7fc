"""Every console script of setup.py answers --help with its options, each with a help text;
those outside the plugin package answer without importing fairseq or torch."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

SCRIPTS = dict(re.findall(r'"([\w-]+) = ([\w.]+:\w+)"', (ROOT / "setup.py").read_text()))


def help_of(entry_point):
    """Run the entry point as its console script would, with --help; report what it imported."""
    module, function = entry_point.split(":")
    code = (f"import sys\nfrom {module} import {function}\nsys.argv[1:] = ['--help']\n"
            f"try:\n    {function}()\nexcept SystemExit as e:\n    status = e.code or 0\n"
            "print('IMPORTED', 'torch' in sys.modules, 'fairseq' in sys.modules)\nsys.exit(status)")
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, text=True, capture_output=True)


def options_without_help(text):
    """The option lines of an argparse --help text that have no help after them."""
    lines = text.splitlines()
    missing = []
    for i, line in enumerate(lines):
        if not re.match(r"^  -", line) or line.strip().startswith("-h, --help"):
            continue
        has_text = re.match(r"^  \S.*?\s{2,}\S", line)
        continued = i + 1 < len(lines) and re.match(r"^ {10,}\S", lines[i + 1])
        if not has_text and not continued:
            missing.append(line.strip())
    return missing


def test_setup_lists_the_console_scripts():
    assert {"convs2s-user-dir", "convs2s-prepare", "convs2s-recipe", "convs2s-plot-attention",
            "convs2s-average-checkpoints", "convs2s-import-fconv"} <= set(SCRIPTS)


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_help_lists_every_option_with_its_help(name):
    proc = help_of(SCRIPTS[name])
    assert proc.returncode == 0, proc.stderr[-3000:]
    text, imported = proc.stdout.rsplit("IMPORTED", 1)
    assert text.startswith(f"usage: {name}") and "-h, --help" in text
    assert options_without_help(text) == []
    # fairseq reads a relative --user-dir from the current folder: only the plugin's absolute one works anywhere
    assert "--user-dir fairseq_convs2s_ext" not in " ".join(text.split())
    if not SCRIPTS[name].startswith("fairseq_convs2s_ext."):  # the plugin package registers with fairseq
        assert imported.split() == ["False", "False"], f"{name} --help imported torch or fairseq"


def test_recipe_help_names_the_recipes_with_a_smoke_mode():
    text = help_of(SCRIPTS["convs2s-recipe"]).stdout
    assert re.search(r"recipes\s+with a smoke mode: wmt16-en-ro", text)
    assert all(name in text for name in ("gigaword", "multi30k-demo", "wmt14-en-de", "wmt14-en-fr", "wmt16-en-ro"))


def test_recipe_prints_the_installed_config_folder():
    """`convs2s-recipe --config-dir`: the folder fairseq-hydra-train's --config-dir takes, printed
    at once (without torch or fairseq), whatever else the command line holds."""
    from convs2s_recipes.settings import CONFIG_DIR

    for argv in (["--config-dir"], ["wmt16-en-ro", "--config-dir", "--smoke"]):
        code = (f"import sys\nfrom convs2s_recipes.run import main\nsys.argv[1:] = {argv!r}\ntry:\n    main()\n"
                "except SystemExit as e:\n    assert not e.code, e.code\nprint('IMPORTED', 'torch' in sys.modules)")
        proc = subprocess.run([sys.executable, "-c", code], text=True, capture_output=True)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert proc.stdout.split() == [CONFIG_DIR, "IMPORTED", "False"]
    assert {"paper.yaml", "recipe"} <= {p.name for p in Path(CONFIG_DIR).iterdir()}


def test_user_dir_is_printed_without_importing_the_plugin():
    """`$(convs2s-user-dir)` runs in front of fairseq commands: it finds the plugin's folder
    without importing it (the import loads torch and fairseq: 5 to 8 s on 2 cores)."""
    code = ("import sys\nfrom convs2s_recipes.user_dir import main\nmain([])\n"
            "print('IMPORTED', 'torch' in sys.modules, 'fairseq' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], cwd="/", text=True, capture_output=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == [str(ROOT / "fairseq_convs2s_ext"), "IMPORTED", "False", "False"]


def test_the_plugin_imports_torch_compile_only_where_used():
    """torch._dynamo takes about 2 s to import: every fairseq command that loads the plugin
    would pay it, while only --compile needs it."""
    code = "import sys, fairseq_convs2s_ext\nprint('IMPORTED', 'torch._dynamo' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, text=True, capture_output=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[-2:] == ["IMPORTED", "False"]
