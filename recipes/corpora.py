"""The corpora of the paper's experiments (section 4.1), found in or fetched into a data folder.

Every file has a place in the data folder (see :func:`data_root`): a file already there is
used as it is, so a machine without internet access runs a recipe from local copies laid out
the same way. A missing file is fetched from its public source (statmt.org, OPUS and GitHub
files; development and test sets through sacreBLEU's own downloader, which keeps its archives
in its cache, ``~/.sacrebleu`` or ``SACREBLEU``), archives landing in ``DATA/downloads``. Each
file is written atomically, and one listed in :data:`SHA256` only if it has the recorded bytes.
"""
import gzip
import logging
import os
import shutil
import tarfile
import zipfile
from dataclasses import dataclass
from typing import Optional, Tuple

import sacrebleu.utils

from convs2s_preprocess.runtime.atomic import atomic_outputs
from convs2s_preprocess.runtime.host import cache_folder

from .download import REMEDY, DownloadError, fetch, mirrored, sha256_of

logger = logging.getLogger(__name__)


def data_root() -> str:
    """The data folder, the one place this rule is written: ``CONVS2S_DATA`` when set (the
    Makefile sets it from ``DATA=``); else ``../shared/data``, ``shared/data`` beside the
    current folder, where that folder exists (this project's machines: a checkout beside
    ``shared/``, commands run from its root); else the user's cache folder,
    ``$XDG_CACHE_HOME/convs2s`` or ``~/.cache/convs2s``. Where the package is installed plays
    no part, and nothing is ever created beside the current folder."""
    if os.environ.get("CONVS2S_DATA"):
        return os.environ["CONVS2S_DATA"]
    shared = os.path.abspath(os.path.join(os.pardir, "shared", "data"))
    if os.path.isdir(shared):
        return shared
    return cache_folder()


# SHA-256 of the files the demo and the default tests read, as they land in the data folder
# (unpacked), taken from the upstream files: a file that changed upstream is refused, naming
# it, instead of silently becoming other data. sacreBLEU checks its own archives (MD5).
SHA256 = {
    "multi30k/train.en": "460a15fbd157e34a7a9957ee388c1ca247fe47af3ef25fb50442af6c274e0fc6",
    "multi30k/train.de": "2c2b73fd2b548fbcde3a875e0a78d6ee94d498bfdee6bd3eae3945779e9ddf72",
    "multi30k/val.en": "1f2a23d992769b5b3d209b0a10dd0b77c08cceb1f20dfb97ed0aafa49d107227",
    "multi30k/val.de": "660e09eb7e1da2f856ea13ee5ad3cf6d36b3d5b0b733c857e94c5747a3dfc660",
    "multi30k/test_2016_flickr.en": "399a4382932c1aadd3ceb9bef1008d388a64c76d4ae4e9d4728c6f4301cac182",
    "multi30k/test_2016_flickr.de": "4be6b5b3236b79c25475c6bb829800a7ce559e9ba7a1f6c2394fe4d40be46d16",
    "ro-sts-en-ro/train.en": "4f977090eb8beeb61a76876b1ba60462104633979f2c13f439fb1134a43648a8",
    "ro-sts-en-ro/train.ro": "ea7ca3d0ca6c2c0ffa70413a2fe006a0aca55c9f467c6f30a4b6dcc731307838",
}


class ChecksumError(DownloadError):
    """A fetched file whose bytes are not those recorded in :data:`SHA256`."""


@dataclass(frozen=True)
class Source:
    """Where a file comes from: a URL (a plain or gzipped text file, or an archive holding a
    member whose path ends with ``member``), or a sacreBLEU test set (name, pair, side)."""

    url: Optional[str] = None
    member: Optional[str] = None
    sacrebleu: Optional[Tuple[str, str, str]] = None

    def materialize(self, path, data_dir, sha256=None):
        """Write the file to `path`; with `sha256`, only if its bytes have that digest."""
        with atomic_outputs([path]) as (temp,):
            if self.sacrebleu:
                test_set, pair, side = self.sacrebleu
                try:
                    files = [sacrebleu.utils.get_source_file(test_set, pair)] if side == "src" else \
                        sacrebleu.utils.get_reference_files(test_set, pair)
                except OSError as e:
                    raise DownloadError(f"could not fetch sacreBLEU's test set {test_set} for {path} ({e}): "
                                        f"{REMEDY}") from None
                shutil.copyfile(files[0], temp)
                return
            archive = fetch(self.url, os.path.join(data_dir, "downloads", _file_name(self.url)))
            with _open_member(archive, self.url, self.member) as src, open(temp, "wb") as out:
                shutil.copyfileobj(src, out)
            digest = sha256_of(temp) if sha256 else None
            if digest != sha256:
                os.remove(archive)
                raise ChecksumError(
                    f"{path}: the file from {mirrored(self.url)} has SHA-256 {digest}, not the recorded {sha256}: "
                    f"it changed upstream or was damaged on the way; {archive} was deleted so that a rerun "
                    f"downloads it again (a copy you trust placed at {path} is used as it is)")


def _file_name(url):
    return url.rstrip("/").split("/")[-1].split("=")[-1]


def _open_member(archive, url, member):
    if member is None:
        return gzip.open(archive) if url.endswith(".gz") else open(archive, "rb")
    if zipfile.is_zipfile(archive):
        z = zipfile.ZipFile(archive)
        names = [n for n in z.namelist() if n.endswith(member)]
        opener = z.open
    else:
        t = tarfile.open(archive)
        names = [n for n in t.getnames() if n.endswith(member)]
        opener = t.extractfile
    if not names:
        raise DownloadError(f"{archive} (from {url}) has no file ending in {member}")
    stream = opener(names[0])
    return gzip.open(stream) if names[0].endswith(".gz") else stream


@dataclass(frozen=True)
class Corpus:
    """A parallel corpus: the files ``DATA/folder/name.LANG`` and their sources."""

    folder: str
    name: str
    sources: dict  # language -> Source

    def prefix(self, data_dir):
        """Make sure both sides are in the data folder; return their common prefix."""
        prefix = os.path.join(data_dir, self.folder, self.name)
        for lang, source in self.sources.items():
            path = f"{prefix}.{lang}"
            if not os.path.exists(path):
                logger.info("%s is missing: fetching it from its public source", path)
                source.materialize(path, data_dir, SHA256.get(f"{self.folder}/{self.name}.{lang}"))
        return prefix


def _archived(folder, name, url, member_pattern, langs):
    return Corpus(folder, name, {lang: Source(url=url, member=member_pattern.format(lang=lang)) for lang in langs})


def _test_set(folder, name, test_set, src, tgt):
    pair = f"{src}-{tgt}"
    return Corpus(folder, name, {src: Source(sacrebleu=(test_set, pair, "src")),
                                 tgt: Source(sacrebleu=(test_set, pair, "ref"))})


STATMT = "http://statmt.org"
EN_RO, EN_DE, EN_FR = ("en", "ro"), ("en", "de"), ("en", "fr")

EUROPARL_V8 = _archived("wmt16-en-ro", "europarl-v8", "http://data.statmt.org/wmt16/translation-task/training-parallel-ep-v8.tgz",
                        "europarl-v8.ro-en.{lang}", EN_RO)
SETIMES2 = _archived("wmt16-en-ro", "setimes2", "http://opus.nlpl.eu/download.php?f=SETIMES/v2/moses/en-ro.txt.zip",
                     "SETIMES.en-ro.{lang}", EN_RO)
# Sennrich et al.'s back-translated news: with the bitext above, the paper's 2.8M pairs.
BACKTRANSLATIONS = Corpus("wmt16-en-ro", "backtranslations", {
    lang: Source(url=f"http://data.statmt.org/rsennrich/wmt16_backtranslations/en-ro/corpus.bt.en-ro.{lang}.gz")
    for lang in EN_RO})
RO_STS = Corpus("ro-sts-en-ro", "train", {
    lang: Source(url=f"https://raw.githubusercontent.com/dumitrescustefan/RO-STS/master/dataset/ro-en/RO-STS.train.{lang}")
    for lang in EN_RO})


def _wmt14_bitext(tgt):
    folder, langs, pair = f"wmt14-en-{tgt}", ("en", tgt), f"{tgt}-en"
    return (
        _archived(folder, "europarl-v7", f"{STATMT}/wmt13/training-parallel-europarl-v7.tgz", f"europarl-v7.{pair}.{{lang}}", langs),
        _archived(folder, "commoncrawl", f"{STATMT}/wmt13/training-parallel-commoncrawl.tgz", f"commoncrawl.{pair}.{{lang}}", langs),
        _archived(folder, "news-commentary-v9", f"{STATMT}/wmt14/training-parallel-nc-v9.tgz", f"news-commentary-v9.{pair}.{{lang}}", langs),
    )


WMT14_EN_FR_EXTRA = (
    _archived("wmt14-en-fr", "undoc-2000", f"{STATMT}/wmt13/training-parallel-un.tgz", "undoc.2000.fr-en.{lang}", EN_FR),
    _archived("wmt14-en-fr", "giga-fren", f"{STATMT}/wmt10/training-giga-fren.tar", "giga-fren.release2.fixed.{lang}.gz", EN_FR),
)


def _multi30k(name):
    base = "https://github.com/multi30k/dataset/raw/master/data/task1/raw"
    return Corpus("multi30k", name, {lang: Source(url=f"{base}/{name}.{lang}.gz") for lang in EN_DE})


# Gigaword as prepared by Rush et al. (2015), the paper's summarization data: article -> title.
GIGAWORD_URL = "https://drive.google.com/uc?export=download&id=1USoQ8lJgN8kAWnUnRrupMGrPMLlDVqlV"


def _gigaword(split):
    return _archived("gigaword", split, GIGAWORD_URL, f"{split}.{{lang}}.txt", ("article", "title"))


@dataclass(frozen=True)
class Experiment:
    """The data of one experiment: languages, training corpora, validation and test sets."""

    src: str
    tgt: str
    train: tuple
    valid: Corpus
    test: Corpus


EXPERIMENTS = {
    "wmt16-en-ro": Experiment("en", "ro", (EUROPARL_V8, SETIMES2, BACKTRANSLATIONS),
                              _test_set("wmt16-en-ro", "newsdev2016", "wmt16/dev", "en", "ro"),
                              _test_set("wmt16-en-ro", "newstest2016", "wmt16", "en", "ro")),
    "wmt14-en-de": Experiment("en", "de", _wmt14_bitext("de"),
                              _test_set("wmt14-en-de", "newstest2013", "wmt13", "en", "de"),
                              _test_set("wmt14-en-de", "newstest2014", "wmt14/full", "en", "de")),
    "wmt14-en-fr": Experiment("en", "fr", _wmt14_bitext("fr") + WMT14_EN_FR_EXTRA,
                              _test_set("wmt14-en-fr", "newstest2013", "wmt13", "en", "fr"),
                              _test_set("wmt14-en-fr", "newstest2014", "wmt14/full", "en", "fr")),
    "gigaword": Experiment("article", "title", (_gigaword("train"),), _gigaword("valid"), _gigaword("test")),
    # Small and local: the smoke run of the en-ro recipe, and the CPU demo.
    "wmt16-en-ro-smoke": Experiment("en", "ro", (RO_STS,),
                                    _test_set("wmt16-en-ro", "newsdev2016", "wmt16/dev", "en", "ro"),
                                    _test_set("wmt16-en-ro", "newstest2016", "wmt16", "en", "ro")),
    "multi30k-en-de": Experiment("en", "de", (_multi30k("train"),), _multi30k("val"), _multi30k("test_2016_flickr")),
}


def concatenate(corpora, data_dir, out_prefix, langs):
    """Fetch the training corpora and write their concatenation to ``out_prefix.LANG``."""
    prefixes = [corpus.prefix(data_dir) for corpus in corpora]
    paths = [f"{out_prefix}.{lang}" for lang in langs]
    if all(os.path.exists(p) for p in paths):
        return out_prefix
    with atomic_outputs(paths) as temps:
        for lang, temp in zip(langs, temps):
            with open(temp, "wb") as out:
                for prefix in prefixes:
                    with open(f"{prefix}.{lang}", "rb") as f:
                        shutil.copyfileobj(f, out)
    return out_prefix
