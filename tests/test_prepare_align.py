"""convs2s-prepare --align-dict: the alignment dictionary beside the steps after its text."""
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import DATA, ROOT
from convs2s_preprocess.stages.align import WORK_PREFIX, build_align_dict, find_aligner
from faults import processes_mentioning, wait_until

MULTI30K = DATA / "multi30k"
needs_data = pytest.mark.skipif(not MULTI30K.is_dir(), reason=f"Multi30k not found under {DATA}")


def corpus(folder: Path, lines: int) -> str:
    """The first ``lines`` pairs of Multi30k en-de's training text; its file prefix."""
    folder.mkdir()
    for lang in ("en", "de"):
        with open(MULTI30K / f"train.{lang}", encoding="utf-8") as f:
            (folder / f"train.{lang}").write_text("".join(next(f) for _ in range(lines)),
                                                 encoding="utf-8")
    return str(folder / "train")


def prepare(*args, path: str = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=f"{path}{os.pathsep}{os.environ['PATH']}") if path else None
    return subprocess.run([sys.executable, "-m", "convs2s_preprocess.pipeline", "-s", "en", "-t", "de",
                           "--workers", "2", "--align-dict", *map(str, args)],
                          cwd=ROOT, capture_output=True, text=True, env=env)


def fake_fast_align(folder: Path, script: str) -> str:
    """A ``fast_align`` executable running ``script`` (sh), found first on PATH; its folder."""
    folder.mkdir()
    program = folder / "fast_align"
    program.write_text(f"#!/bin/sh\n{script}\n")
    program.chmod(0o755)
    return str(folder)


@needs_data
def test_dictionary_of_the_segmented_text_built_beside_binarizing(tmp_path):
    train, out = corpus(tmp_path / "raw", 600), tmp_path / "out"
    proc = prepare("--trainpref", train, "-o", out, "--bpe-merges", 300)
    assert proc.returncode == 0, proc.stderr
    # Built from the training text that is binarized, as convs2s-align-dict builds it.
    alone = tmp_path / "alone"
    alone.mkdir()
    build_align_dict(str(out / "bpe" / "train.en"), str(out / "bpe" / "train.de"),
                     str(alone / "align.dict"), find_aligner(), str(alone / "candidates"), workers=2)
    assert (out / "align.dict").read_bytes() == (alone / "align.dict").read_bytes()
    assert (out / "align.candidates").read_bytes() == (alone / "candidates").read_bytes()
    assert "@@" in (out / "align.dict").read_text(encoding="utf-8")
    # It started once the segmented training text was written, before binarizing ended.
    log = proc.stderr
    assert log.index("apply BPE train: done") < log.index("alignment dictionary: writing") \
        < log.index("binarize: done")
    assert not list(out.glob(WORK_PREFIX + "*"))

    proc = prepare("--trainpref", train, "-o", out, "--bpe-merges", 300)
    assert proc.returncode == 0 and "alignment dictionary: reused" in proc.stderr, proc.stderr


@needs_data
def test_a_failed_alignment_is_one_error_after_the_data_is_binarized(tmp_path):
    train, out = corpus(tmp_path / "raw", 200), tmp_path / "out"
    path = fake_fast_align(tmp_path / "bin", "echo 'fast_align: out of luck' >&2; exit 3")
    proc = prepare("--trainpref", train, "-o", out, "--no-bpe", path=path)
    assert proc.returncode == 1
    error = proc.stderr[proc.stderr.index("\nerror: ") + 1:].splitlines()
    assert error[0] == "error: alignment dictionary: fast_align failed with exit status 3:"
    assert error[1].startswith(f"  {path}/fast_align -i ") and error[2:] == ["fast_align: out of luck"]
    assert "Traceback" not in proc.stderr
    assert (out / "bin" / "train.en-de.de.bin").is_file()  # the other steps finished
    assert not (out / "align.dict").exists() and not list(out.glob(WORK_PREFIX + "*"))


@needs_data
def test_a_failure_beside_it_stops_the_aligner_and_removes_its_work(tmp_path):
    train, out = corpus(tmp_path / "raw", 200), tmp_path / "out"
    started = tmp_path / "aligner-started"
    path = fake_fast_align(tmp_path / "bin", f"touch {started}; sleep 60")
    bad = tmp_path / "dict.txt"  # fails binarizing, after fairseq's import: the aligner runs
    bad.write_text("word\n")
    begin = time.monotonic()
    proc = prepare("--trainpref", train, "-o", out, "--no-bpe", "--srcdict", bad, path=path)
    assert proc.returncode == 1 and time.monotonic() - begin < 50, proc.stderr
    assert proc.stderr.splitlines()[-1].startswith(f"error: --srcdict {bad}: not a fairseq dictionary")
    assert started.exists()
    assert wait_until(lambda: not processes_mentioning(str(out)), 10), processes_mentioning(str(out))
    assert not list(out.glob(WORK_PREFIX + "*")) and not (out / "align.dict").exists()


@needs_data
def test_a_killed_prepare_takes_its_aligner_along_and_a_rerun_finishes(tmp_path):
    train, out = corpus(tmp_path / "raw", 200), tmp_path / "out"
    started = tmp_path / "aligner-started"
    path = fake_fast_align(tmp_path / "bin", f"touch {started}; sleep 60")
    args = [sys.executable, "-m", "convs2s_preprocess.pipeline", "-s", "en", "-t", "de", "--workers", "2",
            "--align-dict", "--trainpref", train, "-o", str(out), "--no-bpe"]
    proc = subprocess.Popen(args, cwd=ROOT, stderr=subprocess.DEVNULL,
                            env=dict(os.environ, PATH=f"{path}{os.pathsep}{os.environ['PATH']}"))
    try:
        assert wait_until(started.exists, 60)
    finally:
        proc.kill()
        proc.wait()
    assert wait_until(lambda: not processes_mentioning(str(out)), 10), processes_mentioning(str(out))
    # The worker that ran the aligner removes its folder once the aligner has ended, with no
    # command waiting for it: on a busy machine that can come after the aligner is gone.
    assert wait_until(lambda: not list(out.glob(WORK_PREFIX + "*")), 10), list(out.glob(WORK_PREFIX + "*"))
    assert not (out / "align.dict").exists()

    rerun = prepare("--trainpref", train, "-o", out, "--no-bpe")  # the builtin aligner this time
    assert rerun.returncode == 0, rerun.stderr
    assert "tokenize train: reused" in rerun.stderr and (out / "align.candidates").is_file()
