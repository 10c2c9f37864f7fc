"""Resumable, checked downloads into the corpus cache.

A file is fetched to ``NAME.part`` (continued with an HTTP range request when a previous
attempt was cut off), checked, and only then renamed to ``NAME``: a file under its final
name is always complete. The check is the archive's own integrity (gzip CRC, tar
structure) and, where the source publishes one, a SHA-256 digest.

``CONVS2S_DATA_URL=BASE`` fetches every http(s) URL from a mirror instead: ``BASE/HOST/PATH``
(the layout ``wget --force-directories`` writes), e.g. ``http://127.0.0.1:8000/github.com/multi30k/...``.
"""
import gzip
import hashlib
import logging
import os
import shutil
import tarfile
import urllib.error
import urllib.parse
import urllib.request
import zipfile

logger = logging.getLogger(__name__)
CHUNK = 1 << 20
# The two ways out when a corpus can be neither found nor fetched.
REMEDY = "connect to the internet and rerun, or set CONVS2S_DATA (make DATA=DIR) to a folder that holds the corpora"


class DownloadError(Exception):
    pass


def fetch(url, path, sha256=None):
    """Download `url` (or its mirror, see ``CONVS2S_DATA_URL``) to `path` unless it is already
    there; return `path`."""
    if os.path.exists(path):
        return path
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    url = mirrored(url)
    part = path + ".part"
    try:
        _download(url, part)
    except OSError as e:
        raise DownloadError(f"could not download {url} to {path} ({e}): {REMEDY}") from None
    check(part, url, sha256, path)
    os.replace(part, path)
    return path


def mirrored(url):
    """`url`, or its place on the mirror ``CONVS2S_DATA_URL`` names: BASE/HOST/PATH[?QUERY]."""
    base, parts = os.environ.get("CONVS2S_DATA_URL"), urllib.parse.urlsplit(url)
    if not base or parts.scheme not in ("http", "https"):
        return url
    return f"{base.rstrip('/')}/{parts.netloc}{parts.path}" + (f"?{parts.query}" if parts.query else "")


def _download(url, part):
    """Write `url` to `part`. A `part` left by a cut-off attempt is continued with a range
    request; a server that ignores the range (200) or finds nothing left to send (416)
    makes it start over."""
    done = os.path.getsize(part) if os.path.exists(part) else 0
    request = urllib.request.Request(url, headers={"Range": f"bytes={done}-"} if done else {})
    logger.info("downloading %s -> %s%s", url, part, f" (resuming at {done} bytes)" if done else "")
    try:
        response = urllib.request.urlopen(request, timeout=60)
    except urllib.error.HTTPError as e:
        e.close()
        if e.code != 416 or not done:
            raise
        os.remove(part)
        return _download(url, part)
    with response, open(part, "ab" if response.status == 206 else "wb") as out:
        shutil.copyfileobj(response, out, CHUNK)


def check(path, url, sha256=None, name=None):
    """Fail (and drop the partial file) if `path` is not a complete, intact archive; the
    error names the file as `name` (default: `path`)."""
    try:
        if sha256 and (digest := sha256_of(path)) != sha256:
            raise DownloadError(f"SHA-256 mismatch: {digest} != {sha256}")
        if url.endswith((".tgz", ".tar.gz", ".tar")):
            with tarfile.open(path) as tar:
                tar.getmembers()
        elif url.endswith(".gz"):
            with gzip.open(path) as f:
                while f.read(CHUNK):
                    pass
        elif url.endswith(".zip"):
            with zipfile.ZipFile(path) as z:
                if z.testzip() is not None:
                    raise DownloadError("corrupt member in zip archive")
    except (OSError, EOFError, tarfile.TarError, zipfile.BadZipFile, DownloadError) as e:
        os.remove(path)
        raise DownloadError(f"{name or path}: {url} downloaded incompletely or corrupt ({e}); "
                            "the partial file was deleted, rerun to fetch it again") from None


def sha256_of(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()
