"""Fetching corpora as a fresh clone does, without a network: the recipes' downloader against a
mirror of the real corpus files served over HTTP on 127.0.0.1 (CONVS2S_DATA_URL), and the data
folder rule (CONVS2S_DATA, else ../shared/data where it exists, else the user's cache folder).
Nothing here contacts an address other than the loopback interface."""
import functools
import gzip
import http.server
import os
import shutil
import socket
import subprocess
import sys
import threading
import urllib.parse

import pytest

from conftest import BIN, DATA, ROOT, TEST_CORPORA
from convs2s_recipes import corpora
from convs2s_recipes.download import DownloadError, sha256_of

# The corpora the default suite reads that come from a URL (the others are sacreBLEU's test sets).
URL_CORPORA = [c for c in TEST_CORPORA if all(source.url for source in c.sources.values())]
MULTI30K_VAL = corpora.EXPERIMENTS["multi30k-en-de"].valid
SERVER_SECONDS = 300  # the mirror stops itself after this, whatever happens to the test


class MirrorHandler(http.server.SimpleHTTPRequestHandler):
    """Serves the mirror folder, logging each request's path and Range header to
    ``server.requests``; with ``server.ranges`` it answers ``Range: bytes=N-`` as a web server
    does (206 with the rest, 416 past the end), otherwise it sends the whole file (200)."""

    def send_head(self):
        wanted = self.headers.get("Range")
        self.server.requests.append((urllib.parse.unquote(self.path), wanted))
        path = self.translate_path(self.path)
        if not (wanted and self.server.ranges and os.path.isfile(path)):
            return super().send_head()
        start, size = int(wanted.removeprefix("bytes=").rstrip("-")), os.path.getsize(path)
        if start >= size:
            self.send_error(416)
            return None
        f = open(path, "rb")
        f.seek(start)
        self.send_response(206)
        self.send_header("Content-Range", f"bytes {start}-{size - 1}/{size}")
        self.send_header("Content-Length", str(size - start))
        self.end_headers()
        return f

    def log_message(self, *args):
        pass


def mirror_path(root, url):
    """Where a mirror laid out as CONVS2S_DATA_URL expects (BASE/HOST/PATH) keeps `url`."""
    parts = urllib.parse.urlsplit(url)
    return root / parts.netloc / parts.path.lstrip("/")


@pytest.fixture(scope="module")
def mirror(tmp_path_factory):
    """The test corpora's source files, made from the session's data folder (gzipped where the
    source is a .gz), served on 127.0.0.1; yields the server (``url``, ``root``, ``requests``,
    ``ranges``)."""
    root = tmp_path_factory.mktemp("mirror")
    for corpus in URL_CORPORA:
        for lang, source in corpus.sources.items():
            path = mirror_path(root, source.url)
            path.parent.mkdir(parents=True, exist_ok=True)
            data = (DATA / corpus.folder / f"{corpus.name}.{lang}").read_bytes()
            path.write_bytes(gzip.compress(data, mtime=0) if source.url.endswith(".gz") else data)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(MirrorHandler, directory=root))
    server.root, server.requests, server.ranges = root, [], True
    server.url = f"http://127.0.0.1:{server.server_address[1]}"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    deadline = threading.Timer(SERVER_SECONDS, server.shutdown)
    deadline.start()
    yield server
    deadline.cancel()
    server.shutdown()
    server.server_close()


@pytest.fixture
def served(mirror, monkeypatch):
    """The mirror as the downloader's base URL, with a fresh request log and range requests on."""
    monkeypatch.setenv("CONVS2S_DATA_URL", mirror.url)
    mirror.requests.clear()
    mirror.ranges = True
    return mirror


def served_file(mirror, corpus, lang):
    return mirror_path(mirror.root, corpus.sources[lang].url)


def test_a_fresh_data_folder_is_filled_from_the_mirror_and_checked(served, tmp_path):
    data = tmp_path / "data"
    for corpus in URL_CORPORA:
        corpus.prefix(str(data))
    for corpus in URL_CORPORA:
        for lang in corpus.sources:
            relative = f"{corpus.folder}/{corpus.name}.{lang}"
            assert (data / relative).read_bytes() == (DATA / relative).read_bytes()
            assert sha256_of(data / relative) == corpora.SHA256[relative]
    # each file fetched once, from the mirror, at the place CONVS2S_DATA_URL's layout gives it
    expected = sorted("/" + str(served_file(served, c, lang).relative_to(served.root))
                      for c in URL_CORPORA for lang in c.sources)
    assert sorted(path for path, _ in served.requests) == expected
    assert not list((data / "downloads").glob("*.part")) and not list(data.rglob(".*.tmp"))
    served.requests.clear()
    MULTI30K_VAL.prefix(str(data))  # present: nothing is fetched again
    assert served.requests == []


@pytest.mark.parametrize("ranges, kept", [
    (True, "half"),   # resumed: the server sends the rest (206)
    (False, "half"),  # replaced: the server ignores the range and sends it all (200)
    (True, "all"),    # replaced: nothing left to send (416), so it is fetched again from the start
], ids=["resumed", "replaced-200", "replaced-416"])
def test_a_cut_off_download_is_resumed_or_replaced(served, tmp_path, ranges, kept):
    served.ranges = ranges
    data = tmp_path / "data"
    whole = served_file(served, MULTI30K_VAL, "en").read_bytes()
    kept_bytes = len(whole) // 2 if kept == "half" else len(whole)
    part = data / "downloads" / "val.en.gz.part"
    part.parent.mkdir(parents=True)
    part.write_bytes(whole[:kept_bytes])
    MULTI30K_VAL.prefix(str(data))
    assert (data / "multi30k" / "val.en").read_bytes() == (DATA / "multi30k" / "val.en").read_bytes()
    assert (data / "downloads" / "val.en.gz").read_bytes() == whole and not part.exists()
    ranges_asked = [wanted for path, wanted in served.requests if path.endswith("/val.en.gz")]
    assert ranges_asked == [f"bytes={kept_bytes}-"] + ([None] if kept == "all" else [])


def one_line_error(excinfo):
    message = str(excinfo.value)
    assert "\n" not in message
    return message


def test_a_truncated_download_is_refused_naming_the_file(served, tmp_path):
    data = tmp_path / "data"
    served_gz = served_file(served, MULTI30K_VAL, "de")
    good = served_gz.read_bytes()
    try:
        served_gz.write_bytes(good[: len(good) // 2])
        with pytest.raises(DownloadError) as excinfo:
            MULTI30K_VAL.prefix(str(data))
        message = one_line_error(excinfo)
        assert message.startswith(f"{data / 'downloads' / 'val.de.gz'}: {served.url}/")
        assert "incompletely or corrupt" in message and "rerun" in message
        assert not (data / "multi30k" / "val.de").exists() and not list((data / "downloads").glob("val.de*"))
    finally:
        served_gz.write_bytes(good)
    MULTI30K_VAL.prefix(str(data))  # the rerun fetches it whole
    assert sha256_of(data / "multi30k" / "val.de") == corpora.SHA256["multi30k/val.de"]


def test_a_file_changed_upstream_is_refused_by_its_checksum(served, tmp_path):
    """A well-formed gzip with other text (one sentence changed) passes the archive's own check;
    the recorded SHA-256 of the unpacked file refuses it, naming the file, and keeps nothing."""
    data = tmp_path / "data"
    served_gz = served_file(served, MULTI30K_VAL, "de")
    good = served_gz.read_bytes()
    lines = gzip.decompress(good).decode("utf-8").splitlines(keepends=True)
    try:
        served_gz.write_bytes(gzip.compress("".join(["Ein anderer Satz.\n"] + lines[1:]).encode("utf-8")))
        with pytest.raises(corpora.ChecksumError) as excinfo:
            MULTI30K_VAL.prefix(str(data))
        message = one_line_error(excinfo)
        assert message.startswith(f"{data / 'multi30k' / 'val.de'}: the file from {served.url}/github.com/")
        assert corpora.SHA256["multi30k/val.de"] in message and "changed upstream" in message
        assert not (data / "multi30k" / "val.de").exists() and not (data / "downloads" / "val.de.gz").exists()
        assert not list((data / "multi30k").glob(".*.tmp"))
    finally:
        served_gz.write_bytes(good)
    MULTI30K_VAL.prefix(str(data))
    assert sha256_of(data / "multi30k" / "val.de") == corpora.SHA256["multi30k/val.de"]


def test_the_data_folder_holds_the_test_corpora():
    """What pytest_sessionstart fetched (or found): every file the default suite reads, those with
    a recorded SHA-256 with exactly those bytes."""
    for corpus in TEST_CORPORA:
        for lang in corpus.sources:
            relative = f"{corpus.folder}/{corpus.name}.{lang}"
            assert (DATA / relative).stat().st_size > 0, relative
            if relative in corpora.SHA256:
                assert sha256_of(DATA / relative) == corpora.SHA256[relative], relative


def run_pytest(env, *args):
    """This file's tests in a fresh pytest process (its session start fetching what DATA lacks)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CONVS2S_", "PYTEST_"))} | env
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
                          cwd=ROOT, env=env, text=True, capture_output=True, timeout=300)


def test_a_test_run_on_a_fresh_data_folder_fetches_the_test_corpora_first(served, tmp_path):
    """`make test` on a fresh clone, here against the loopback mirror: the session fetches the
    Multi30k and RO-STS files before any test runs (sacreBLEU's WMT16 sets, which go through
    sacreBLEU's own downloader, are placed in the folder beforehand)."""
    data = tmp_path / "data"
    for corpus in TEST_CORPORA:
        if corpus not in URL_CORPORA:
            (data / corpus.folder).mkdir(parents=True, exist_ok=True)
            for lang in corpus.sources:
                relative = f"{corpus.folder}/{corpus.name}.{lang}"
                shutil.copyfile(DATA / relative, data / relative)
    proc = run_pytest({"CONVS2S_DATA": str(data), "CONVS2S_DATA_URL": served.url},
                      f"{__file__}::test_the_data_folder_holds_the_test_corpora")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"fetching 8 test corpus files missing from {data}" in proc.stdout
    assert len(served.requests) == 8


def test_a_test_run_that_cannot_fetch_the_corpora_stops_at_once_with_one_line(tmp_path):
    with socket.socket() as s:  # a loopback port nothing listens on: the network is out of reach
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    data = tmp_path / "empty"
    proc = run_pytest({"CONVS2S_DATA": str(data), "CONVS2S_DATA_URL": closed},
                      f"{__file__}::test_the_data_folder_holds_the_test_corpora")
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR
    assert proc.stdout == f"fetching 12 test corpus files missing from {data}\n"
    assert proc.stderr.strip().startswith(f"ERROR: the test corpora are not all in {data} and could not be "
                                          f"fetched: could not download {closed}/github.com/multi30k/")
    assert proc.stderr.strip().endswith("connect to the internet and rerun, or set CONVS2S_DATA (make DATA=DIR) "
                                        "to a folder that holds the corpora")
    assert len(proc.stderr.strip().splitlines()) == 1


def test_the_data_folder_rule(served, tmp_path, monkeypatch):
    """CONVS2S_DATA; else shared/data beside the current folder (a checkout's root) only where
    it exists; else the user's cache folder, which a clone with nothing beside it fills.
    `convs2s-data --where` prints the folder in use."""
    checkout = tmp_path / "parent" / "convs2s"
    checkout.mkdir(parents=True)
    monkeypatch.chdir(checkout)
    monkeypatch.delenv("CONVS2S_DATA", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert corpora.data_root() == str(tmp_path / "xdg" / "convs2s")
    MULTI30K_VAL.prefix(corpora.data_root())
    assert (tmp_path / "xdg" / "convs2s" / "multi30k" / "val.de").is_file()
    assert os.listdir(tmp_path / "parent") == ["convs2s"]  # nothing was created beside the checkout
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert corpora.data_root() == str(tmp_path / "home" / ".cache" / "convs2s")
    (tmp_path / "parent" / "shared" / "data").mkdir(parents=True)
    assert corpora.data_root() == str(tmp_path / "parent" / "shared" / "data")
    monkeypatch.setenv("CONVS2S_DATA", str(tmp_path / "mine"))
    assert corpora.data_root() == str(tmp_path / "mine")

    where = subprocess.run([BIN / "convs2s-data", "--where"], text=True, capture_output=True, check=True)
    assert where.stdout == f"{tmp_path / 'mine'}\n"
    env = {k: v for k, v in os.environ.items() if k != "CONVS2S_DATA"}
    where = subprocess.run([BIN / "convs2s-data", "--where"], env=env, cwd=ROOT, text=True, capture_output=True,
                           check=True)
    shared = ROOT.parent / "shared" / "data"
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    assert where.stdout == f"{shared if shared.is_dir() else os.path.join(cache, 'convs2s')}\n"
