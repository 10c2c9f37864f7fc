"""Resumable, checked downloads into the corpus cache.

A file is fetched to ``NAME.part`` (continued with an HTTP range request when a previous
attempt was cut off), checked, and only then renamed to ``NAME``: a file under its final
name is always complete. The check is the archive's own integrity (gzip CRC, tar
structure) and, where the source publishes one, a SHA-256 digest.
"""
import gzip
import hashlib
import logging
import os
import tarfile
import urllib.request
import zipfile

logger = logging.getLogger(__name__)
CHUNK = 1 << 20


class DownloadError(Exception):
    pass


def fetch(url, path, sha256=None):
    """Download `url` to `path` unless it is already there; return `path`."""
    if os.path.exists(path):
        return path
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    part = path + ".part"
    done = os.path.getsize(part) if os.path.exists(part) else 0
    request = urllib.request.Request(url, headers={"Range": f"bytes={done}-"} if done else {})
    logger.info("downloading %s -> %s%s", url, path, f" (resuming at {done} bytes)" if done else "")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            mode = "ab" if done and response.status == 206 else "wb"
            with open(part, mode) as out:
                while chunk := response.read(CHUNK):
                    out.write(chunk)
    except OSError as e:
        raise DownloadError(
            f"could not download {url} to {path}: {e}. Rerun to resume, or place the file there "
            "by hand (set CONVS2S_DATA / DATA= to a folder that already holds the corpora)"
        ) from None
    check(part, url, sha256)
    os.replace(part, path)
    return path


def check(path, url, sha256=None):
    """Fail (and drop the partial file) if `path` is not a complete, intact archive."""
    try:
        if sha256:
            digest = hashlib.sha256()
            with open(path, "rb") as f:
                for chunk in iter(lambda: f.read(CHUNK), b""):
                    digest.update(chunk)
            if digest.hexdigest() != sha256:
                raise DownloadError(f"SHA-256 mismatch: {digest.hexdigest()} != {sha256}")
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
        raise DownloadError(f"{url} downloaded incompletely or corrupt ({e}); rerun to fetch it again") from None
