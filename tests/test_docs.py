"""The documentation a user reads is checked like code.

- The site (mkdocs.yml, docs/) builds with ``mkdocs build --strict``: a broken link or
  anchor, a page outside the nav, a nav entry without a page or a docstring that does not
  render fails the build, and so does a console script of setup.py without a reference page.
- README.md's quickstart, the commands between its ``--8<-- [start:quickstart]`` markers
  (docs/quickstart.md includes the same lines), runs on a few hundred lines of Multi30k, each
  command as written with only the options of SHRINK appended (argparse takes an option's
  last value), so a documented command that stops working fails here.
- Every other command in README.md is checked as far as it can be without a network or 15
  minutes: make targets exist, the extras it installs are setup.py's.
- bench/plots.py draws the performance page's PNGs from benchmark JSON.
"""
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BIN = Path(sys.executable).parent  # the virtual environment's commands
sys.path[:0] = [str(ROOT), str(ROOT / "docs")]  # bench/ and docs/gen_cli_reference.py, not installed
import gen_cli_reference  # noqa: E402  (docs/ is not a package)

# Appended to the README's commands in the quickstart test: a tiny model, two updates, few merges.
SHRINK = {
    "convs2s-prepare": ["--bpe-merges", "200"],
    "fairseq-train": ["--arch", "convs2s_tiny", "--max-update", "2", "--no-progress-bar"],
    "fairseq-generate": ["--max-len-b", "10"],  # a model of two updates rarely ends a sentence
}
QUICKSTART = re.compile(r"<!-- --8<-- \[start:quickstart\] -->(.*?)<!-- --8<-- \[end:quickstart\] -->", re.S)
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
INSTALLING = {"pip", "python3", "source", "touch", ".venv/bin/pip"}  # checked against setup.py, not run


def fenced(text, language):
    return [body for lang, body in FENCE.findall(text) if lang == language]


def commands(script):
    """The shell commands of a bash block: continuations joined, comments dropped, split at
    ``&&`` and ``|``; each as its list of words."""
    lines = re.sub(r"\\\n\s*", " ", script).splitlines()
    out = []
    for line in lines:
        for part in re.split(r"&&|\|", line):
            words = shlex.split(part, comments=True)
            if words:
                out.append(words)
    return out


def shrunk(script):
    """The block with SHRINK's options appended to its commands (before any comment)."""
    lines = []
    for line in re.sub(r"\\\n\s*", " ", script).splitlines():
        line = re.sub(r"\s+#.*$", "", line)
        words = line.split()
        if words and words[0] in SHRINK:
            line += " " + " ".join(SHRINK[words[0]])
        lines.append(line)
    return "\n".join(lines) + "\n"


def test_the_readme_fits_a_screen_and_a_bit():
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 120


def test_the_site_builds_with_no_warnings(tmp_path):
    site = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)],
                          cwd=ROOT, capture_output=True, text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    for command in gen_cli_reference.console_scripts():
        page = (site / "cli" / command / "index.html").read_text(encoding="utf-8")
        assert f"usage: {command}" in page
    model = (site / "reference" / "model" / "index.html").read_text(encoding="utf-8")
    assert "fairseq_convs2s_ext.models.convs2s.ConvS2SModel" in model  # mkdocstrings rendered it
    for picture in ("speed", "memory", "bleu-time"):
        assert (site / "performance" / f"{picture}.png").stat().st_size > 0


@pytest.mark.slow  # a second build of the site
def test_a_console_script_left_out_of_the_nav_fails_the_build(tmp_path):
    """The generated page of a command the nav does not name is a warning, so --strict stops.
    (Not under -q: mkdocs then counts no warnings, and --strict passes anything.)"""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    for section in config["nav"]:
        if isinstance(section, dict) and "Command-line reference" in section:
            section["Command-line reference"].remove("cli/convs2s-score.md")
    config["docs_dir"] = str(ROOT / "docs")
    config["hooks"] = [str(ROOT / h) for h in config["hooks"]]
    config["plugins"][1]["mkdocstrings"]["handlers"]["python"]["paths"] = [str(ROOT)]
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(tmp_path / "mkdocs.yml"),
                           "-d", str(tmp_path / "site")], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode != 0
    assert "cli/convs2s-score.md" in proc.stderr


def test_every_console_script_has_a_reference_page_in_the_nav():
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))["nav"]
    reference = next(section["Command-line reference"] for section in nav
                     if isinstance(section, dict) and "Command-line reference" in section)
    pages = {Path(page).stem for page in reference if page != "cli/index.md"}
    assert pages == set(gen_cli_reference.console_scripts())


@pytest.mark.slow  # ten processes, most of them importing fairseq
def test_a_reference_page_is_the_installed_command_s_own_help():
    for command, target in gen_cli_reference.console_scripts().items():
        text = gen_cli_reference.help_text(command, target)
        assert text.startswith(f"usage: {command}")
        installed = subprocess.run([str(BIN / command), "--help"], capture_output=True, text=True,
                                   env={**os.environ, "COLUMNS": gen_cli_reference.WIDTH})
        assert installed.stdout.strip() == text


def test_the_readme_s_links_lead_to_files_and_headings():
    from markdown.extensions.toc import slugify

    text = README.read_text(encoding="utf-8")
    for target in re.findall(r"\]\(([^)#]+\.md)(?:#([^)]+))?\)", text):
        path, anchor = ROOT / target[0], target[1]
        assert path.exists(), target[0]
        if anchor:
            headings = re.findall(r"^#+ (.+)$", path.read_text(encoding="utf-8"), re.M)
            assert anchor in {slugify(h, "-") for h in headings}, f"{target[0]}#{anchor}"


def test_every_readme_command_outside_the_quickstart_is_checked():
    """make targets are dry-run, install lines' extras and torch pin are setup.py's and the
    Makefile's; any other command must be in the quickstart, which runs."""
    text = README.read_text(encoding="utf-8")
    quickstart = QUICKSTART.search(text).group(1)
    outside = text.replace(quickstart, "")
    setup = (ROOT / "setup.py").read_text(encoding="utf-8")
    torch_pin = re.search(r"TORCH_VERSION \?= (\S+)", (ROOT / "Makefile").read_text()).group(1)
    for block in fenced(outside, "bash"):
        for words in commands(block):
            if words[0] == "make":
                dry = subprocess.run(["make", "-n", *words[1:]], cwd=ROOT, capture_output=True, text=True)
                assert dry.returncode == 0, f"make {' '.join(words[1:])}: {dry.stderr}"
            elif words[0] in INSTALLING:
                for extras in re.findall(r"\.\[([\w,]+)\]", " ".join(words)):
                    for extra in extras.split(","):
                        assert f'"{extra}":' in setup, f"README installs .[{extra}], which setup.py lacks"
                for pin in re.findall(r"torch==(\S+)", " ".join(words)):
                    assert pin == torch_pin
            else:
                pytest.fail(f"README command not tested: {' '.join(words)}")


def test_the_readme_quickstart_runs(tmp_path, data_dir):
    """prepare, train (2 updates of a tiny model), generate, score, and translate from Python."""
    raw = tmp_path / "raw"
    raw.mkdir()
    sizes = {"train": ("train", 300), "valid": ("val", 20), "test": ("test_2016_flickr", 10)}
    for split, (name, count) in sizes.items():
        for lang in ("en", "de"):
            lines = (data_dir / "multi30k" / f"{name}.{lang}").read_text(encoding="utf-8").splitlines()[:count]
            (raw / f"{split}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    quickstart = QUICKSTART.search(README.read_text(encoding="utf-8")).group(1)
    [bash], [python] = fenced(quickstart, "bash"), fenced(quickstart, "python")
    script = tmp_path / "quickstart.sh"
    script.write_text(shrunk(bash), encoding="utf-8")
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run(["bash", "-euo", "pipefail", str(script)], cwd=tmp_path, env=env, capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "checkpoints" / "checkpoint_best.pt").exists()
    assert re.search(r"^BLEU = .*\n.*tok:13a", proc.stdout, re.M)  # convs2s-score's line and signature
    translated = subprocess.run([sys.executable, "-c", python], cwd=tmp_path, env=env, capture_output=True,
                                text=True)
    assert translated.returncode == 0, translated.stderr[-3000:]
    assert translated.stdout.strip()  # two updates translate into something, not nothing


def test_the_plots_are_drawn_from_benchmark_json(tmp_path):
    from bench.plots import load, render

    record = {"commit": "abc1234", "command": "python -m bench.benchmark --train-bleu",
              "args": {"data": "demo"}, "machine": {"device": "some CPU"},
              "results": {"fconv": {"train tokens/s": 100.0, "beam 5 sentences/s": 10.0, "train peak MiB": 50,
                                    "BLEU after training": 20.0, "train seconds": 60.0},
                          "ours": {"train tokens/s": 120.0, "beam 5 sentences/s": 15.0, "train peak MiB": 40,
                                   "BLEU after training": 21.0, "train seconds": 50.0},
                          "loss curves": {"fconv": [9.0, 8.5]}, "dictionaries": "10 / 10"}}
    paths = render([record], tmp_path / "one")
    assert sorted(p.name for p in paths) == ["bleu-time.png", "memory.png", "speed.png"]
    for path in paths:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the performance page's own figures
    shipped = load([ROOT / "docs" / "performance" / "results.json"])
    assert all(r["commit"] and r["command"] and r["machine"]["device"] for r in shipped)
    assert len(render(shipped, tmp_path / "docs")) == 3
