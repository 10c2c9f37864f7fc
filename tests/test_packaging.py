"""The package as others receive it: a licence they may use it under, metadata an index can
show, a citation, and no link that passes fairseq's repository off as this project's.

The distribution is built the way an index gets it: an sdist from a copy of the checkout's
files (nothing is written into the checkout), then a wheel from that sdist, so a file the
sdist leaves out (README.md, LICENSE) is missing from the wheel too.
"""
import ast
import email.parser
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
import yaml

from test_docs import mkdocs_config

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ("setup.py", "MANIFEST.in", "README.md", "LICENSE", "CITATION.cff")
PACKAGES = ("fairseq_convs2s_ext", "preprocess", "recipes", "serving")
FAIRSEQ_REPOSITORY = "github.com/facebookresearch/fairseq"


def setup_keyword(name):
    """A keyword argument of setup.py's ``setup()`` call, as a literal (setup.py is not run)."""
    tree = ast.parse((ROOT / "setup.py").read_text(encoding="utf-8"))
    constants = {t.id: node.value for node in tree.body if isinstance(node, ast.Assign)
                 for t in node.targets if isinstance(t, ast.Name)}
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == name:
            value = constants.get(node.value.id, node.value) if isinstance(node.value, ast.Name) else node.value
            return ast.literal_eval(value)
    raise KeyError(name)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(sdist member names, wheel METADATA as a message, wheel member names, the wheel)."""
    base = tmp_path_factory.mktemp("packaging")
    source = base / "source"
    source.mkdir()
    for name in SHIPPED:
        shutil.copy(ROOT / name, source)
    for name in PACKAGES:
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    subprocess.run([sys.executable, "setup.py", "-q", "sdist", "-d", str(base / "sdist")], cwd=source, check=True,
                   capture_output=True)
    (sdist,) = (base / "sdist").glob("*.tar.gz")
    with tarfile.open(sdist) as archive:
        sdist_names = [Path(*Path(m).parts[1:]).as_posix() for m in archive.getnames()]
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(base / "dist"), str(sdist)], cwd=base, check=True, capture_output=True)
    (wheel,) = (base / "dist").glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode("utf-8")
        licence = archive.read(next(n for n in names if n.endswith(".dist-info/licenses/LICENSE"))).decode("utf-8")
    return sdist_names, email.parser.Parser().parsestr(metadata), licence


def test_the_licence_is_mit_with_the_project_s_copyright():
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert text.startswith("MIT License\n")
    assert "Copyright (c) 2026 the fairseq ConvS2S plugin authors" in text
    assert "Permission is hereby granted, free of charge, to any person obtaining a copy" in text
    assert 'THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND' in text


def test_the_sdist_and_the_wheel_carry_the_licence_readme_and_citation(built):
    sdist_names, _, licence = built
    assert {"LICENSE", "README.md", "CITATION.cff", "setup.py"} <= set(sdist_names)
    assert licence == (ROOT / "LICENSE").read_text(encoding="utf-8")  # dist-info/licenses/LICENSE


def test_the_wheel_s_metadata_is_complete(built):
    _, metadata, _ = built
    assert metadata["License-Expression"] == "MIT"
    assert metadata.get_all("License-File") == ["LICENSE"]
    assert metadata["Description-Content-Type"] == "text/markdown"
    assert metadata.get_payload().strip() == (ROOT / "README.md").read_text(encoding="utf-8").strip()
    classifiers = metadata.get_all("Classifier")
    assert "Programming Language :: Python :: 3" in classifiers
    assert "Topic :: Scientific/Engineering :: Artificial Intelligence" in classifiers
    assert not [c for c in classifiers if c.startswith("License ::")]  # superseded by License-Expression (PEP 639)
    urls = dict(line.split(", ", 1) for line in metadata.get_all("Project-URL"))
    assert urls == setup_keyword("project_urls")
    assert urls["Paper"] == "https://arxiv.org/abs/1705.03122"


def test_nothing_passes_fairseq_s_repository_off_as_this_project_s():
    """Neither the package's home or source URL nor the site's header link (repo_url) points
    at fairseq's repository; where both name a repository, they name the same one."""
    urls = setup_keyword("project_urls")
    homes = {label: url for label, url in urls.items()
             if label.lower() in {"homepage", "home", "source", "source code", "repository", "code"}}
    assert not [url for url in homes.values() if FAIRSEQ_REPOSITORY in url]
    repo_url = mkdocs_config().get("repo_url")
    assert repo_url is None or FAIRSEQ_REPOSITORY not in repo_url
    if repo_url and homes:
        assert repo_url in homes.values()


def test_the_citation_file_cites_this_software_and_the_paper():
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text(encoding="utf-8"))
    assert cff["cff-version"] == "1.2.0"
    assert cff["type"] == "software" and cff["message"] and cff["title"]  # the schema's required keys
    assert cff["authors"] == [{"name": "the fairseq ConvS2S plugin authors"}]
    assert str(cff["version"]) == setup_keyword("version")
    assert cff["license"] == "MIT"
    paper = cff["preferred-citation"]
    assert paper["title"] == "Convolutional Sequence to Sequence Learning"
    assert paper["year"] == 2017 and "ICML" in paper["conference"]["name"]
    assert [a["family-names"] for a in paper["authors"]] == ["Gehring", "Auli", "Grangier", "Yarats", "Dauphin"]
