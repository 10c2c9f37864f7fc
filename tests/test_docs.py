"""The documentation a user reads is checked like code.

- The site (mkdocs.yml, docs/) builds with ``mkdocs build --strict``: a broken link or
  anchor, a page outside the nav, a nav entry without a page or a docstring that does not
  render fails the build, and so does a console script of setup.py without a reference page.
- It builds from any folder (``mkdocs build -f /abs/path/mkdocs.yml``).
- README.md's quickstart, the commands between its ``--8<-- [start:quickstart]`` markers
  (docs/quickstart.md includes the same lines), runs on a few hundred lines of Multi30k, each
  command as written with only the options of SHRINK appended (argparse takes an option's
  last value), so a documented command that stops working fails here.
- Every shell block of README.md and docs/*.md runs too (``-m slow``), in the order a reader
  meets them, in one fresh folder, shrunk the same way, each block's time printed. A block
  that cannot run here says why in an HTML comment just above it, ``<!-- skip: REASON -->``,
  and is reported by name with that reason. In the default suite the blocks are checked
  without running them: every command is one this project installs, and every folder a
  command reads was written by an earlier block (the same folder names on every page, a
  checkpoint used with the data it was trained on).
- Every other command in README.md is checked as far as it can be without a network or 15
  minutes: make targets exist, the extras it installs are setup.py's.
- bench/plots.py draws the performance page's PNGs from benchmark JSON.
"""
import os
import posixpath
import re
import shlex
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BIN = Path(sys.executable).parent  # the virtual environment's commands
sys.path[:0] = [str(ROOT), str(ROOT / "docs")]  # bench/ and docs/gen_cli_reference.py, not installed
import gen_cli_reference  # noqa: E402  (docs/ is not a package)

# Appended to the documented commands when they run here: few merges, a tiny model, 5 short
# epochs (5 epoch checkpoints for convs2s-average-checkpoints --num-epoch-checkpoints 5), short
# translations (so small a model rarely ends a sentence), 2 updates under hydra (whose
# overrides cannot be given twice, so the documented model stays).
SHRINK = {
    "convs2s-prepare": ["--bpe-merges", "200"],
    "fairseq-train": ["--arch", "convs2s_tiny", "--max-epoch", "5", "--no-progress-bar"],
    "fairseq-generate": ["--max-len-b", "10"],
    "fairseq-interactive": ["--max-len-b", "10"],
    "fairseq-hydra-train": ["optimization.max_update=2"],
}
SHRINK_UNLESS = {"convs2s-prepare": "--no-bpe"}  # --bpe-merges and --no-bpe exclude each other
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
        if words and words[0] in SHRINK and SHRINK_UNLESS.get(words[0], "\0") not in words:
            line += " " + " ".join(SHRINK[words[0]])
        lines.append(line)
    return "\n".join(lines) + "\n"


def mkdocs_config():
    """mkdocs.yml as MkDocs reads it, ``!relative $config_dir`` taken as the checkout."""
    class Loader(yaml.SafeLoader):
        pass

    Loader.add_constructor("!relative", lambda loader, node: str(ROOT))
    return yaml.load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"), Loader=Loader)


# Blocks of pages that others keep, skipped with these reasons until the pages mark them.
PAGE_REASONS = {
    "docs/safety.md": "the test suite's fault tests (pytest), which `make test-slow` runs",
    "docs/performance.md": "reproduces the page's figures (the benchmark, make demo) on full data, minutes to hours "
                           "each; tests/test_bench.py runs the benchmark small",
}
RUN_LANGUAGES = {"bash", "sh", "shell", "python"}
BLOCK = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>[\w-]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.S | re.M)
SKIP = re.compile(r"<!--\s*skip:\s*(.+?)\s*-->")


@dataclass
class Block:
    page: str  # relative to the checkout
    line: int
    language: str
    body: str  # dedented
    skip: str  # why it does not run here; "" when it runs

    @property
    def name(self):
        first = self.body.split(None, 1)[0] if self.body.strip() else ""
        return f"{self.page}:{self.line} ({self.language}: {first} ...)"


def pages():
    """README.md, then the pages of docs/ in the order of the site's nav."""
    def nav_pages(items):
        for item in items:
            if isinstance(item, str):
                yield item
            elif isinstance(item, dict):
                for value in item.values():
                    yield from nav_pages(value if isinstance(value, list) else [value])

    ordered = [page for page in nav_pages(mkdocs_config()["nav"]) if (ROOT / "docs" / page).exists()]
    on_disk = {path.name for path in (ROOT / "docs").glob("*.md")}
    return [README] + [ROOT / "docs" / page for page in ordered] + \
        [ROOT / "docs" / name for name in sorted(on_disk - set(ordered))]


def doc_blocks():
    """Every fenced block of README.md and the docs pages in the languages this test runs, in
    reading order, each with its skip reason."""
    blocks = []
    for path in pages():
        text = path.read_text(encoding="utf-8")
        page = path.relative_to(ROOT).as_posix()
        for match in BLOCK.finditer(text):
            if match["lang"] not in RUN_LANGUAGES:
                continue
            before = text[:match.start()].rstrip().rsplit("\n", 1)[-1]
            marked = SKIP.search(before)
            reason = marked.group(1) if marked else PAGE_REASONS.get(page, "")
            line = text.count("\n", 0, match.start()) + 1
            blocks.append(Block(page, line, match["lang"], textwrap.dedent(match["body"]), reason))
    return blocks


def option(words, name):
    """The value after ``name`` in a command's words (None if absent)."""
    return words[words.index(name) + 1] if name in words else None


def test_the_readme_fits_a_screen_and_a_bit():
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 120


def test_the_readme_s_first_screen_says_what_how_and_how_fast():
    """Its first 40 lines: what it is, the install, `make demo` and `make test`, and a table of
    figures, each with its machine, linking to the performance page."""
    screen = "\n".join(README.read_text(encoding="utf-8").splitlines()[:40])
    assert "Convolutional Sequence to Sequence Learning" in screen
    assert "make install" in screen and "make demo" in screen and "make test" in screen
    rows = [line for line in screen.splitlines() if line.startswith("|") and "](docs/performance.md#" in line]
    assert len(rows) >= 3
    for row in rows:
        assert re.search(r"\| [^|]*(cores|GPU|H100)[^|]* \|$", row), f"a figure without its machine: {row}"


def test_the_site_builds_from_any_folder_with_no_warnings(tmp_path):
    """``mkdocs build -f /abs/path/mkdocs.yml`` from a folder outside the checkout: every path
    of the config (docs, hooks, the snippets README.md is included from, mkdocstrings' source)
    is the config's own folder, not the current one."""
    site, elsewhere = tmp_path / "site", tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
                           "-d", str(site)], cwd=elsewhere, capture_output=True, text=True,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not any(elsewhere.iterdir())  # nothing written where it ran
    quickstart = (site / "quickstart" / "index.html").read_text(encoding="utf-8")
    assert "convs2s-prepare" in quickstart  # README.md's quickstart, included by the snippet
    home = (site / "index.html").read_text(encoding="utf-8")
    assert "md-source" not in home and "facebookresearch/fairseq" not in home  # no header link to fairseq's repository
    for command in gen_cli_reference.console_scripts():
        page = (site / "cli" / command / "index.html").read_text(encoding="utf-8")
        assert f"usage: {command}" in page
    model = (site / "reference" / "model" / "index.html").read_text(encoding="utf-8")
    assert "fairseq_convs2s_ext.models.convs2s.ConvS2SModel" in model  # mkdocstrings rendered it
    check_the_api_reference(site)
    for picture in ("speed", "memory", "bleu-time"):
        assert (site / "performance" / f"{picture}.png").stat().st_size > 0


# The API reference's pages, what each documents in full, and its options tables (page, config, hydra group).
API_PAGES = {
    "hub": ["fairseq_convs2s_ext.models.hub_interface"],
    "task": ["fairseq_convs2s_ext.tasks.convs2s_translation.ConvS2STranslationTask"],
    "criterion": ["fairseq_convs2s_ext.criterions.convs2s_cross_entropy.ConvS2SCrossEntropyCriterion"],
}
OPTIONS_TABLES = [("model", "fairseq_convs2s_ext.models.convs2s.ConvS2SConfig", "model"),
                  ("task", "fairseq_convs2s_ext.tasks.convs2s_translation.ConvS2STranslationConfig", "task"),
                  ("criterion", "fairseq_convs2s_ext.criterions.convs2s_cross_entropy.ConvS2SCrossEntropyConfig",
                   "criterion")]


def check_the_api_reference(site):
    """Every public class, function and method of the hub module, the task and the criterion has
    its entry, and every field of the three configs its row: the hydra key, the command-line
    option and the field's own help."""
    import dataclasses
    import html
    import importlib
    import inspect

    import gen_api_reference

    def page(name):
        return html.unescape((site / "reference" / name / "index.html").read_text(encoding="utf-8"))

    for name, targets in API_PAGES.items():
        text = page(name)
        for target in targets:
            try:
                obj = importlib.import_module(target)
            except ModuleNotFoundError:
                module, attr = target.rsplit(".", 1)
                obj = getattr(importlib.import_module(module), attr)
            if inspect.ismodule(obj):
                public = [n for n, v in vars(obj).items() if not n.startswith("_")
                          and (inspect.isclass(v) or inspect.isfunction(v)) and v.__module__ == obj.__name__]
            else:
                public = [n for n, v in vars(obj).items() if not n.startswith("_") and callable(
                    getattr(v, "__func__", v))]
            assert public, target
            for member in public:
                assert f'id="{target}.{member}"' in text, f"reference/{name}.md lacks {target}.{member}"
    for name, target, group in OPTIONS_TABLES:
        text = page(name)
        for field in dataclasses.fields(gen_api_reference.load(target)):
            if field.name.startswith("_"):
                continue
            assert f"{group}.{field.name}" in text, f"reference/{name}.md lacks {group}.{field.name}"
            help = " ".join(field.metadata.get("help", "").split())
            assert help in " ".join(text.split()), f"reference/{name}.md lacks the help of {field.name}"
            if not str(field.default).startswith("${") and field.name != "data":
                assert "--" + field.name.replace("_", "-") in text


@pytest.mark.slow  # a second build of the site
def test_a_console_script_left_out_of_the_nav_fails_the_build(tmp_path):
    """The generated page of a command the nav does not name is a warning, so --strict stops.
    (Not under -q: mkdocs then counts no warnings, and --strict passes anything.)"""
    config = mkdocs_config()
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
    nav = mkdocs_config()["nav"]
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
    """prepare, train (5 short epochs of a tiny model), generate, score, and translate from Python."""
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


FAIRSEQ = {"fairseq-train", "fairseq-generate", "fairseq-interactive", "fairseq-hydra-train"}
# What the reader brings: the quickstart's raw text (any language pair) and text to translate.
GIVEN = {"raw/train", "raw/valid", "raw/test", "sentences.en"}


def test_every_block_of_the_docs_runs_or_says_why_not():
    """Each block runs here or carries a reason; the runnable ones hold only commands this
    project installs (or fairseq's), with nothing left for the reader to fill in."""
    blocks = doc_blocks()
    assert {b.page for b in blocks} >= {"README.md", "docs/translating.md", "docs/training.md", "docs/preparing-data.md"}
    known = FAIRSEQ | set(gen_cli_reference.console_scripts())
    for block in blocks:
        if block.skip or block.language == "python":
            continue
        assert "..." not in block.body, f"{block.name}: an elided command cannot be copied"
        for words in commands(block.body):
            assert words[0] in known, f"{block.name}: {words[0]} is not a command this project installs"


def test_the_pages_commands_read_what_earlier_commands_wrote():
    """Read in order, as one reader in one folder: every folder a command reads was written by
    an earlier command, and a checkpoint is used with the data it was trained on. (Mismatched
    names across pages, raw/val against raw/valid or a BPE checkpoint on a word-level folder,
    fail here.)"""
    prepared, trained_on, written = set(), {}, set(GIVEN)

    def data_folder(path, where):
        folder = path[:-len("/bin")] if path.endswith("/bin") else path
        assert folder in prepared, f"{where}: {path} is no folder an earlier convs2s-prepare wrote ({sorted(prepared)})"
        return folder

    for block in doc_blocks():
        if block.skip or block.language == "python":
            continue
        for words in commands(block.body):
            where = f"{block.name}: {' '.join(words)[:80]}"
            program = words[0]
            if ">" in words:
                written.add(words[words.index(">") + 1])
            if "<" in words:
                assert words[words.index("<") + 1] in written, f"{where}: reads a file nothing wrote"
            if program == "convs2s-prepare":
                for name in ("--trainpref", "--validpref", "--testpref"):
                    if option(words, name):
                        assert option(words, name) in GIVEN, f"{where}: {name} {option(words, name)}"
                prepared.add(option(words, "-o"))
            elif program == "convs2s-align-dict":
                for name in ("--src", "--tgt"):
                    data_folder(option(words, name).split("/tok/")[0], where)
                written.update(filter(None, (option(words, "-o"), option(words, "--candidates"))))
            elif program == "fairseq-train":
                trained_on[option(words, "--save-dir")] = data_folder(words[1], where)
                if option(words, "--vocab-selection"):
                    assert option(words, "--vocab-selection") in written, where
            elif program == "fairseq-hydra-train":
                settings = dict(w.split("=", 1) for w in words if "=" in w and not w.startswith("-"))
                trained_on[settings["checkpoint.save_dir"]] = data_folder(settings["task.data"], where)
            elif program in ("fairseq-generate", "fairseq-interactive", "convs2s-plot-attention"):
                data = data_folder(option(words, "--data") or words[1], where)
                checkpoints = posixpath.dirname(option(words, "--path"))
                assert trained_on.get(checkpoints) == data, \
                    f"{where}: {checkpoints} holds a model trained on {trained_on.get(checkpoints)}, not on {data}"
                for name in ("--replace-unk", "--vocab-selection", "--bpe-codes"):
                    if option(words, name) and not option(words, name).startswith("-"):
                        value = option(words, name)
                        assert value in written or value.split("/")[0] in prepared, f"{where}: {name} {value}"
            elif program == "convs2s-average-checkpoints":
                assert option(words, "--inputs") in trained_on, where
            elif program == "convs2s-score":
                assert option(words, "-s") in written and option(words, "-r").rsplit(".", 1)[0] in GIVEN, where


def _raw_corpora(folder, data_dir):
    """What the pages expect the reader to have: raw/{train,valid,test}.{en,de,ro} and
    sentences.en. en and de are Multi30k's; ro is RO-STS's Romanian, so the en-ro pages run
    on unaligned pairs (they are checked to run, not to learn)."""
    raw = folder / "raw"
    raw.mkdir()
    sources = {"en": ("multi30k", "train", "val", "test_2016_flickr"), "de": ("multi30k", "train", "val", "test_2016_flickr"),
               "ro": ("ro-sts-en-ro", "train", "dev", "test")}
    for lang, (corpus, *names) in sources.items():
        for split, name, count in zip(("train", "valid", "test"), names, (300, 20, 10)):
            lines = (data_dir / corpus / f"{name}.{lang}").read_text(encoding="utf-8").splitlines()[:count]
            (raw / f"{split}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    test = (data_dir / "multi30k" / "test_2016_flickr.en").read_text(encoding="utf-8").splitlines()
    (folder / "sentences.en").write_text("\n".join(test[10:13]) + "\n", encoding="utf-8")


@pytest.mark.slow  # about 3.5 minutes on 2 cores: 15 blocks, 5 trainings
def test_every_block_of_the_docs_runs_in_order(tmp_path, data_dir, capsys):
    """README.md's and every page's blocks (shell and Python), in reading order, in one fresh
    folder, on a few hundred lines, shrunk as the quickstart test shrinks them; each block's
    time is printed, and each skipped block with its reason."""
    _raw_corpora(tmp_path, data_dir)
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    for block in doc_blocks():
        if block.skip:
            with capsys.disabled():
                print(f"\n  skipped  {block.name}: {block.skip}", end="")
            continue
        if block.language == "python":
            argv = [sys.executable, "-c", block.body]
        else:
            argv = ["bash", "-euo", "pipefail", "-c", shrunk(block.body)]
        start = time.monotonic()
        proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True)
        with capsys.disabled():
            print(f"\n  {time.monotonic() - start:6.1f} s  {block.name}", end="")
        assert proc.returncode == 0, f"{block.name} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
        if "fairseq-interactive" in block.body:  # a translation for each of sentences.en's 3 lines (W-: its time)
            assert len(re.findall(r"^W-\d+\t", proc.stdout, re.M)) == 3, proc.stdout[-2000:]
    for output in ("checkpoints/checkpoint5.pt", "averaged.pt", "attention/average.png", "data-en-ro/bin",
                   "checkpoints-en-ro/checkpoint_last.pt", "checkpoints-hydra/checkpoint_last.pt",
                   "data-word/align.dict", "checkpoints-word/checkpoint_best.pt",
                   "checkpoints-selection/checkpoint_best.pt", "candidates.txt"):
        assert (tmp_path / output).exists(), output
    with capsys.disabled():
        print()


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


def test_the_plots_compare_only_within_one_run_and_known_data():
    """A BLEU panel holds the points of one benchmark run (two hosts under one machine's name
    once set ours beside fconv from another host), and a record that does not say what data it
    measured is not drawn under a made-up label ("earlier data")."""
    from bench.plots import SPEED, bleu_time, panels_of_bleu_time, ratios

    def record(commit, data, **runs):
        return {"commit": commit, "args": {"data": data} if data else {}, "machine": {"device": "CPU"},
                "results": {run: {"BLEU after training": bleu, "train seconds": 60.0, "beam 5 sentences/s": bleu}
                            for run, bleu in runs.items()}}

    records = [record("a", "demo", ours=15.8), record("b", "demo", fconv=23.1, fconv_long=32.4),
               record("c", None, fconv=1.0, ours=2.0)]
    assert [[label for _, _, label in marks] for _, marks in panels_of_bleu_time(records)] == [
        ["fconv (BPE)", "fconv_long (BPE)"]]
    assert ratios(records, SPEED) == {"CPU": {"BPE\nbeam 5": {"fconv_long": 32.4 / 23.1}}}  # not record c's
    assert bleu_time(records[:1], "unused.png") is None
