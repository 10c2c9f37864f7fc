"""Issue 35: a stage of a pipeline step (tokenize, apply BPE, binarize, the builtin aligner's
decoding) writes its output in shards, and a rerun after a kill reuses the finished ones
(preprocess/runtime/shards.py), on real runs, no mocks: convs2s-prepare and convs2s-align-dict
killed with SIGKILL, and steps stopped by a real error
(invalid UTF-8 part-way through the input) in this process. Shards are made small with the
documented CONVS2S_SHARD_LINES.
"""
import fcntl
import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from conftest import DATA
from convs2s_preprocess.runtime.atomic import run_step, shard_folder
from convs2s_preprocess.runtime import parallel
from convs2s_preprocess.stages.binarize import binarize
from convs2s_preprocess.stages.bpe import apply_bpe_file, learn_joint_bpe, remove_bpe
from convs2s_preprocess.errors import PreprocessError
from convs2s_preprocess.runtime.parallel import map_file
from convs2s_preprocess.runtime.shards import MANIFEST, SHARD_VARIABLE
from convs2s_preprocess.stages.tokenize import tokenize_file
from faults import ENV, command, ctrl_c_as_a_terminal_sends_it, processes_mentioning, wait_until

MULTI30K = DATA / "multi30k"
needs_data = pytest.mark.skipif(not MULTI30K.is_dir(), reason=f"Multi30k not found under {DATA}")
LINES, SHARD = 2400, 30  # 80 shards per file in the killed command
PIPE_PAGE = 4096  # the smallest pipe: 25-30 progress lines of the killed command
BAD_LINE = 350  # invalid UTF-8 there: shards 0-2 of 100 lines are finished when it fails


def _lines(lang: str, count: int) -> list:
    with open(MULTI30K / f"train.{lang}", encoding="utf-8") as f:
        return [line for _, line in zip(range(count), f)]


def _finished(output: Path, subfolder: str = "") -> dict:
    """{shard file: (inode, mtime, size)} of the finished shards of ``output``'s stage, in
    ``subfolder`` of its shard folder where it keeps them there (binarizing: one per input
    file; the aligner: ``aligner``)."""
    folder = Path(shard_folder(str(output))) / subfolder
    try:
        shards = json.loads((folder / MANIFEST).read_text())["shards"]
    except (OSError, ValueError):
        return {}
    found = {}
    for index in shards:
        path = folder / f"{int(index):06d}"
        try:
            st = path.stat()
        except FileNotFoundError:
            continue
        found[path.name] = (st.st_ino, st.st_mtime_ns, st.st_size)
    return found


def _lower_priority() -> None:
    """The command under test at nice 10: on a busy machine this test, polling its shards to
    kill it halfway, must not be starved until it has finished them all. And Ctrl-C reaches
    it as in a terminal, however the test run was started."""
    os.nice(10)
    ctrl_c_as_a_terminal_sends_it()


def _popen(argv: list, folder: Path, env: dict, log: Path, **options) -> subprocess.Popen:
    with open(log, "w") as f:
        return subprocess.Popen(argv, cwd=folder, env=env, stdout=subprocess.DEVNULL, stderr=f,
                                preexec_fn=_lower_priority, **options)


def _kill(proc: subprocess.Popen, folder: Path) -> None:
    proc.kill()
    proc.wait()
    assert wait_until(lambda: not processes_mentioning(str(folder)), 10), \
        f"left running after SIGKILL: {processes_mentioning(str(folder))}"


def _killed_after(argv: list, folder: Path, env: dict, stage: str, lines: int) -> str:
    """Run ``argv`` until its progress says ``stage`` has mapped ``lines`` lines, then SIGKILL
    it; its log. Its stderr is a pipe of one page that this test reads: the command blocks
    on writing once it is a page of progress lines ahead of the test, so however busy the
    machine, it is killed at most that many lines of progress later (not a race against a
    stage that takes a fraction of a second)."""
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, PIPE_PAGE)
    proc = subprocess.Popen(argv, cwd=folder, env=env, stdout=subprocess.DEVNULL,
                            stderr=write_end, preexec_fn=_lower_priority)
    os.close(write_end)
    log, progress = [], re.compile(rf"{re.escape(stage)}: ([\d,]+)/")
    with open(read_end, encoding="utf-8") as stderr:
        for line in stderr:
            log.append(line)
            found = progress.search(line)
            if found and int(found.group(1).replace(",", "")) >= lines:
                break
        _kill(proc, folder)
    assert found, "".join(log)[-3000:]
    return "".join(log)


def _killed_twice_then_finished(argv: list, folder: Path, env: dict, stage: str, output: Path,
                                subfolder: str = "") -> tuple:
    """SIGKILL ``argv`` once ``stage`` has done 4 of its LINES // SHARD shards of ``output``
    (in ``subfolder``, see :func:`_finished`), then again 3 shards into the rerun, then run it to the end;
    check that each rerun resumes from the finished shards without writing them again.
    (the first run's log, the second's, the last run's stderr)."""
    shards = LINES // SHARD
    # The progress of shard 4 is logged after shard 3 is recorded as finished.
    first_log = _killed_after(argv, folder, env, stage, 4 * SHARD)
    first = _finished(output, subfolder)
    assert 3 <= len(first) < shards, f"killed too late: {len(first)} of {shards} shards"

    second_log = _killed_after(argv, folder, env, stage, (len(first) + 3) * SHARD)
    assert f"{stage}: resuming: {len(first)} of {shards} shards already done" in second_log, \
        second_log
    second = _finished(output, subfolder)
    assert len(first) + 2 <= len(second) < shards, \
        f"killed too late: {len(second)} of {shards} shards"
    assert {name: second.get(name) for name in first} == first  # not written again

    done = subprocess.run(argv, cwd=folder, env=env, text=True, capture_output=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"{stage}: resuming: {len(second)} of {shards} shards already done" in done.stderr
    progress = re.findall(rf"{re.escape(stage)}: ([\d,]+)/{LINES:,} ", done.stderr)
    assert int(progress[0].replace(",", "")) >= len(second) * SHARD  # reused shards are done
    return first_log, second_log, done.stderr


@needs_data
def test_killed_stage_resumes_from_its_shards(tmp_path):
    """SIGKILL while train.en is tokenized, then again after the rerun has resumed: the
    rerun reuses the finished shards without writing them again, and the run that ends
    gives what an uninterrupted tokenization and BPE give, with no shard folder left."""
    for lang in ("en", "de"):
        (tmp_path / f"train.{lang}").write_text("".join(_lines(lang, LINES)), encoding="utf-8")
    env = {**ENV, SHARD_VARIABLE: str(SHARD), "CONVS2S_PROGRESS_SECONDS": "0"}
    argv = command("convs2s-prepare", "-s", "en", "-t", "de", "--trainpref", "train", "-o",
                   "out", "--bpe-merges", 200, "--workers", 2)
    stage = f"tokenize {tmp_path / 'train.en'}"
    _killed_twice_then_finished(argv, tmp_path, env, stage, tmp_path / "out" / "tok" / "train.en")

    out = tmp_path / "out"
    assert not list(out.rglob("*.shards")) and not list(out.rglob("*.tmp"))
    for lang in ("en", "de"):  # an uninterrupted run of each stage, here, without shards
        tokenize_file(str(tmp_path / f"train.{lang}"), str(tmp_path / f"plain.{lang}"), lang)
        assert (out / "tok" / f"train.{lang}").read_bytes() == (tmp_path / f"plain.{lang}").read_bytes()
        apply_bpe_file(str(out / "bpe" / "codes"), str(out / "tok" / f"train.clean.{lang}"),
                       str(tmp_path / f"plain.bpe.{lang}"))
        assert (out / "bpe" / f"train.{lang}").read_bytes() == (tmp_path / f"plain.bpe.{lang}").read_bytes()


@needs_data
def test_killed_binarization_resumes_from_its_dictionaries_and_shards(tmp_path, monkeypatch):
    """SIGKILL while train.en is binarized, then again once the rerun binarizes train.de:
    the rerun loads the dictionaries instead of counting the words again and reuses the
    finished shards without writing them again, and the run that ends gives what an
    uninterrupted binarization gives, with no shard folder left."""
    for lang in ("en", "de"):
        (tmp_path / f"train.{lang}").write_text("".join(_lines(lang, LINES)), encoding="utf-8")
    env = {**ENV, SHARD_VARIABLE: str(SHARD), "CONVS2S_PROGRESS_SECONDS": "0"}
    argv = command("convs2s-prepare", "-s", "en", "-t", "de", "--trainpref", "train", "-o",
                   "out", "--bpe-merges", 200, "--workers", 2)
    out = tmp_path / "out"
    counted = [Path(shard_folder(str(out / "bin"))) / f"dict.{lang}.txt" for lang in ("en", "de")]

    _killed_after(argv, tmp_path, env, "binarize out/bpe/train.en", 4 * SHARD)
    lines = sum(1 for _ in open(out / "bpe" / "train.en", encoding="utf-8"))
    shards = -(-lines // SHARD)
    first = _finished(out / "bin", "train.en")
    assert 3 <= len(first) < shards, f"killed too late: {len(first)} of {shards} shards"
    dictionaries = [(path.stat().st_ino, path.stat().st_mtime_ns) for path in counted]

    log = _killed_after(argv, tmp_path, env, "binarize out/bpe/train.de", 4 * SHARD)
    assert "counting the words" not in log and "the dictionaries of the interrupted run" in log, log
    assert [(path.stat().st_ino, path.stat().st_mtime_ns) for path in counted] == dictionaries
    assert f"binarize out/bpe/train.en: resuming: {len(first)} of {shards} shards" in log
    second = _finished(out / "bin", "train.en")
    assert len(second) == shards and {name: second[name] for name in first} == first
    assert 3 <= len(_finished(out / "bin", "train.de")) < shards

    done = subprocess.run(argv, cwd=tmp_path, env=env, text=True, capture_output=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"binarize out/bpe/train.en: resuming: {shards} of {shards} shards" in done.stderr
    assert "binarize out/bpe/train.de: resuming: " in done.stderr
    assert not list(out.rglob("*.shards")) and not list(out.rglob("*.tmp"))
    monkeypatch.chdir(tmp_path)  # preprocess.log names the text as the command did
    binarize("plain", "en", "de", trainpref="out/bpe/train", workers=2)
    assert sorted(os.listdir(out / "bin")) == sorted(os.listdir(tmp_path / "plain"))
    for name in os.listdir(tmp_path / "plain"):
        assert (out / "bin" / name).read_bytes() == (tmp_path / "plain" / name).read_bytes(), name


@needs_data
def test_killed_alignment_resumes_from_its_model_and_shards(tmp_path):
    """SIGKILL while the builtin aligner decodes, then again after the rerun has resumed:
    the rerun loads the trained model instead of training again and reuses the finished
    shards of links without writing them again, and the run that ends writes what an
    uninterrupted run writes, with no shard or work folder left."""
    for lang in ("en", "de"):
        (tmp_path / f"train.{lang}").write_text("".join(_lines(lang, LINES)), encoding="utf-8")
    env = {**ENV, SHARD_VARIABLE: str(SHARD), "CONVS2S_PROGRESS_SECONDS": "0"}
    argv = command("convs2s-align-dict", "--aligner", "builtin", "--src", "train.en", "--tgt",
                   "train.de", "-o", "align.dict", "--candidates", "candidates", "--workers", 2)
    first, second, _ = _killed_twice_then_finished(argv, tmp_path, env, "align",
                                                   tmp_path / "align.dict", "aligner")
    assert "train fast_align's model: iteration 4" in first, first
    model = Path(shard_folder(str(tmp_path / "align.dict"))) / "aligner" / "model"
    assert "train fast_align's model" not in second, second
    assert f"the model trained by the interrupted run: {model}" in second, second
    assert not [path for path in tmp_path.iterdir()
                if path.name.startswith(".") and path.name != ".align.dict.built-from.json"]
    plain = tmp_path / "plain"  # an uninterrupted run, its links in one shard
    plain.mkdir()
    ran = subprocess.run(command("convs2s-align-dict", "--aligner", "builtin", "--src",
                                 "../train.en", "--tgt", "../train.de", "-o", "align.dict",
                                 "--candidates", "candidates", "--workers", 2),
                         cwd=plain, env=ENV, text=True, capture_output=True)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert "resuming" not in ran.stderr
    for name in ("align.dict", "candidates"):
        assert (tmp_path / name).read_bytes() == (plain / name).read_bytes(), name


def _raw_with_bad_line(path: Path, changed_line: str = None) -> Path:
    """1000 English lines with invalid UTF-8 on line BAD_LINE (and ``changed_line`` first)."""
    lines = [line.encode() for line in _lines("en", 1000)]
    lines[BAD_LINE - 1] = b"caf\xe9 au lait\n"
    if changed_line:
        lines[0] = changed_line.encode() + b"\n"
    path.write_bytes(b"".join(lines))
    return path


def _tokenize_step(raw: Path, out: Path, romanian: bool = False):
    return run_step("tokenize", [str(raw)], [str(out)],
                    lambda temp: tokenize_file(str(raw), temp, "en", romanian=romanian),
                    {"lang": "en", "romanian": romanian})


def _fails_after_three_shards(step, out: Path, caplog) -> dict:
    caplog.clear()
    with pytest.raises(PreprocessError, match=f"line {BAD_LINE}: not valid UTF-8"):
        step()
    finished = _finished(out)
    assert len(finished) == 3, sorted(finished)
    return finished


@pytest.fixture
def small_shards(monkeypatch, caplog):
    monkeypatch.setenv(SHARD_VARIABLE, "100")
    caplog.set_level("INFO")


@needs_data
def test_changed_input_reuses_no_shard(tmp_path, caplog, small_shards):
    raw, out = _raw_with_bad_line(tmp_path / "raw.en"), tmp_path / "tok.en"
    first = _fails_after_three_shards(lambda: _tokenize_step(raw, out), out, caplog)
    assert _fails_after_three_shards(lambda: _tokenize_step(raw, out), out, caplog) == first
    assert f"tokenize {raw}: resuming: 3 of 10 shards already done" in caplog.text

    # The bad line corrected and the first line (shard 0) changed: nothing is reused.
    raw.write_text("A changed first line .\n" + "".join(_lines("en", 1000)[1:]), encoding="utf-8")
    caplog.clear()
    assert _tokenize_step(raw, out)
    assert "resuming" not in caplog.text.replace("not resuming", "")
    assert re.search(rf"tokenize {re.escape(str(raw))}: not resuming: .* derived from other input\b",
                     caplog.text), caplog.text
    tokenize_file(str(raw), str(tmp_path / "plain.en"), "en")
    assert out.read_bytes() == (tmp_path / "plain.en").read_bytes()
    assert not os.path.exists(shard_folder(str(out)))


@needs_data
def test_changed_options_reuse_no_shard(tmp_path, caplog, small_shards):
    raw, out = _raw_with_bad_line(tmp_path / "raw.en"), tmp_path / "tok.en"
    first = _fails_after_three_shards(lambda: _tokenize_step(raw, out), out, caplog)
    again = _fails_after_three_shards(lambda: _tokenize_step(raw, out, romanian=True), out, caplog)
    assert "resuming" not in caplog.text.replace("not resuming", "")
    assert "derived from other function, options" in caplog.text, caplog.text
    assert not set(first.values()) & set(again.values())  # every shard written again


@needs_data
def test_codes_learned_again_reuse_no_shard(tmp_path, caplog, small_shards):
    """apply BPE's function names the codes by path: codes learned again there (other
    --bpe-merges) must not let shards segmented with the old ones through."""
    text, out, codes = _raw_with_bad_line(tmp_path / "tok.en"), tmp_path / "bpe.en", tmp_path / "codes"
    good = tmp_path / "good.en"
    good.write_text("".join(_lines("en", 1000)), encoding="utf-8")

    def step():
        return run_step("apply BPE", [str(codes), str(text)], [str(out)],
                        lambda temp: apply_bpe_file(str(codes), str(text), temp))
    learn_joint_bpe([str(good)], str(codes), 50)
    first = _fails_after_three_shards(step, out, caplog)
    learn_joint_bpe([str(good)], str(codes), 300)
    again = _fails_after_three_shards(step, out, caplog)
    assert "resuming" not in caplog.text.replace("not resuming", "")
    assert "derived from other inputs" in caplog.text, caplog.text
    assert not set(first.values()) & set(again.values())


@needs_data
def test_binarization_of_other_inputs_reuses_no_dictionary_or_shard(tmp_path, caplog, small_shards):
    """A binarize step stopped by invalid UTF-8 in its last file, valid.de, after three of its
    shards: run again, it fails there again having loaded the dictionaries and reused every
    finished shard; with train.en's first line changed, it counts the words again and reuses
    no shard, and gives what a binarization outside a step gives."""
    for lang in ("en", "de"):
        (tmp_path / f"train.{lang}").write_text("".join(_lines(lang, 1000)), encoding="utf-8")
    (tmp_path / "valid.en").write_text("".join(_lines("en", 1000)), encoding="utf-8")
    _raw_with_bad_line(tmp_path / "valid.de")
    inputs = [str(tmp_path / f"{split}.{lang}")
              for split in ("train", "valid") for lang in ("en", "de")]
    out = tmp_path / "bin"

    def step():
        return run_step("binarize", inputs, [str(out)], lambda temp: binarize(
            temp, "en", "de", trainpref=str(tmp_path / "train"), validpref=str(tmp_path / "valid"),
            workers=2))
    finished = []
    for _ in range(2):
        caplog.clear()
        with pytest.raises(PreprocessError, match=f"valid.de, line {BAD_LINE}: not valid UTF-8"):
            step()
        finished.append({name: _finished(out, name) for name in ("train.en", "valid.de")})
        assert [len(shards) for shards in finished[-1].values()] == [10, 3]
    assert finished[0] == finished[1]
    assert "counting the words" not in caplog.text
    assert "the dictionaries of the interrupted run" in caplog.text
    assert f"binarize {tmp_path / 'valid.de'}: resuming: 3 of 10 shards already done" in caplog.text

    (tmp_path / "train.en").write_text("A changed first line .\n" + "".join(_lines("en", 1000)[1:]),
                                       encoding="utf-8")
    (tmp_path / "valid.de").write_text("".join(_lines("de", 1000)), encoding="utf-8")
    caplog.clear()
    assert step()
    assert "resuming" not in caplog.text.replace("not resuming", "")
    assert "binarize: not resuming: " in caplog.text and "counting the words" in caplog.text
    binarize(str(tmp_path / "plain"), "en", "de", trainpref=str(tmp_path / "train"),
             validpref=str(tmp_path / "valid"), workers=2)
    for name in os.listdir(tmp_path / "plain"):
        assert (out / name).read_bytes() == (tmp_path / "plain" / name).read_bytes(), name
    assert not os.path.exists(shard_folder(str(out)))


def test_bad_shard_size_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv(SHARD_VARIABLE, "1e6")
    raw = tmp_path / "raw.en"
    raw.write_text("Hello world .\n", encoding="utf-8")
    with pytest.raises(PreprocessError, match=f"{SHARD_VARIABLE}='1e6': give a whole number"):
        _tokenize_step(raw, tmp_path / "tok.en")
    assert sorted(os.listdir(tmp_path)) == ["raw.en"]


def _start_tokenizing(tmp_path: Path, log: Path) -> tuple:
    """convs2s-prepare in a session of its own, once its workers are tokenizing 232,000
    lines (Multi30k's training set 8 times); the process and the tokenized file's path."""
    for lang in ("en", "de"):
        path = tmp_path / f"train.{lang}"
        if not path.exists():
            path.write_text("".join(_lines(lang, 29_000)) * 8, encoding="utf-8")
    argv = command("convs2s-prepare", "-s", "en", "-t", "de", "--trainpref", "train", "-o",
                   "out", "--bpe-merges", 200, "--workers", 2)
    proc = _popen(argv, tmp_path, {**ENV, SHARD_VARIABLE: "5000"}, log, start_new_session=True)
    tok = tmp_path / "out" / "tok" / "train.en"
    assert wait_until(lambda: len(_finished(tok)) >= 2 or proc.poll() is not None, 60)
    assert proc.poll() is None and len(_finished(tok)) < 40, "interrupted too late"
    return proc, argv, tok


@needs_data
def test_workers_of_a_killed_prepare_end_without_a_traceback(tmp_path):
    """SIGKILL of convs2s-prepare while its workers tokenize: they end with it, silently
    (they used to finish their batch and print BrokenPipeError tracebacks on sending it)."""
    proc, _, _ = _start_tokenizing(tmp_path, tmp_path / "run.log")
    _kill(proc, tmp_path)
    log = (tmp_path / "run.log").read_text()
    assert "Traceback" not in log, log[-3000:]


INTERRUPTED = ("interrupted: the finished steps and shards in out are kept; "
               "run the same command again to go on from them")


@needs_data
@pytest.mark.parametrize("sig, status, last_line", [
    (signal.SIGINT, 1, INTERRUPTED),
    pytest.param(signal.SIGTERM, 143, None, marks=pytest.mark.slow),  # the same stop, by another signal
])
def test_ctrl_c_or_sigterm_stop_cleanly_and_the_rerun_goes_on(tmp_path, sig, status, last_line):
    """Ctrl-C (SIGINT to the whole process group, as a terminal sends it) or SIGTERM (as a
    batch scheduler sends it) while the workers tokenize: Ctrl-C's one line, no traceback
    from this process or its workers, no process or half-written file left, and the rerun
    resumes from the finished shards."""
    proc, argv, tok = _start_tokenizing(tmp_path, tmp_path / "run.log")
    os.killpg(proc.pid, sig)
    assert proc.wait(timeout=60) == status
    assert wait_until(lambda: not processes_mentioning(str(tmp_path)), 10), \
        f"left running after {sig.name}: {processes_mentioning(str(tmp_path))}"
    log = (tmp_path / "run.log").read_text()
    assert "Traceback" not in log, log[-3000:]
    if last_line:
        assert log.splitlines()[-1] == last_line
    finished = len(_finished(tok))
    assert finished >= 2 and not list((tmp_path / "out").rglob("*.tmp"))

    done = subprocess.run(argv, cwd=tmp_path, env={**ENV, SHARD_VARIABLE: "5000"}, text=True,
                          capture_output=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"resuming: {finished} of {232_000 // 5000 + 1} shards already done" in done.stderr


def test_chunks_of_shards_in_workers_give_every_line_in_order(tmp_path, monkeypatch, caplog):
    """map_file's workers read chunks of 7 lines of shards of 30 (ragged at both ends), of
    a file with blank lines, \\r endings and a last line without a newline: the output is
    the lines mapped in order, in a step and outside one; invalid UTF-8 in a chunk that a
    worker reads is named with its line, after the shard before it is finished."""
    monkeypatch.setattr(parallel, "MAP_CHUNK_LINES", 7)
    monkeypatch.setenv(SHARD_VARIABLE, "30")
    caplog.set_level("INFO")
    lines = [f"line@@ {n} of@@ f" if n % 9 else ("  \r" if n % 2 else "") for n in range(1, 101)]
    raw = tmp_path / "raw"
    raw.write_bytes("\n".join(lines).encode())  # no newline after the last
    expected = "".join(remove_bpe(line.rstrip("\r")) + "\n" for line in lines)

    assert map_file(remove_bpe, str(raw), str(tmp_path / "plain"), workers=3) == 100
    assert (tmp_path / "plain").read_text(encoding="utf-8") == expected
    out = tmp_path / "stepped"
    run_step("remove BPE", [str(raw)], [str(out)],
             lambda temp: map_file(remove_bpe, str(raw), temp, workers=3, stage="unbpe"), {})
    assert out.read_text(encoding="utf-8") == expected
    assert not list(tmp_path.glob(".*.parts")) and not list(tmp_path.glob(".*.shards"))

    raw.write_bytes("\n".join(lines[:44]).encode() + b"\ncaf\xe9\n" + "\n".join(lines[45:]).encode())
    bad = tmp_path / "bad"
    with pytest.raises(PreprocessError, match=f"^{raw}, line 45: not valid UTF-8"):
        run_step("remove BPE", [str(raw)], [str(bad)],
                 lambda temp: map_file(remove_bpe, str(raw), temp, workers=3, stage="unbpe"), {})
    assert sorted(_finished(bad)) == ["000000"]
