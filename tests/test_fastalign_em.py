"""fast_align's model trained by convs2s_preprocess.aligner.fastalign_em, on real text: the same
figures as fast_align's C++ and the same links as its binary, and the same model for any
number of workers. No mocks: the training runs as convs2s-align-dict runs it.

fast_align's own figures below are those its C++ printed on one thread (systran-align 3.5.0,
which packages clab/fast_align's code, ``generate_alignment_probabilities(verbose=True)``):
the log-likelihood of each of the 4 passes that update the model and the tension after the
2nd to the 4th (``-o``), to the 6 digits it prints.
"""
import gc
import io
import logging
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT
from convs2s_preprocess.aligner import fastalign, fastalign_em
from convs2s_preprocess.aligner.fastalign_em import Chunk, Settings, digamma, expected_feature, pieces, split_pair
from test_align import REFERENCE, needs_reference, write

FAST_ALIGN = {  # (-d, -o, -v) on the first 5000 pairs of the reference corpus
    (True, True, True): ([-1.30691e+06, -298439, -197477, -182365], [6.11832, 7.1172, 7.45237]),
    (True, True, False): ([-1.30691e+06, -230117, -182719, -167375], [5.61712, 6.87401, 7.43439]),
    (False, False, True): ([-1.30691e+06, -372478, -255816, -240118], []),
    (False, False, False): ([-1.30691e+06, -262772, -228513, -215462], []),
}
# ... and on all 29,000 pairs, with -d -o -v
FAST_ALIGN_FULL = ([-7.57643e+06, -1.69025e+06, -1.19632e+06, -1.11212e+06], [6.16297, 7.32284, 7.73904])


def _figures(log: str) -> tuple:
    """(log-likelihoods, tensions) of a training's log, as numbers printed to 6 digits."""
    likelihoods = re.findall(r"iteration \d: log_e likelihood (\S+),", log)
    tensions = re.findall(r"final tension (\S+)", log)
    return [float(x) for x in likelihoods], [float(x) for x in tensions]


def _subset(tmp_path: Path, pairs: int = 5000) -> str:
    with open(REFERENCE / "corpus.en-de", encoding="utf-8") as f:
        return write(tmp_path / "corpus", [line.rstrip("\n") for _, line in zip(range(pairs), f)])


def _train(corpus: str, folder: Path, settings: Settings, workers: int) -> tuple:
    folder.mkdir()
    return fastalign_em.train(corpus, str(folder), settings, workers)


@needs_reference
@pytest.mark.parametrize("settings", list(FAST_ALIGN), ids=lambda s: "".join(
    flag for flag, on in zip(("d", "o", "v"), s) if on) or "none")
def test_training_gives_fast_aligns_figures(tmp_path, caplog, settings):
    """With or without the diagonal prior, its tension and the Dirichlet prior."""
    caplog.set_level(logging.INFO)
    table, tension = _train(_subset(tmp_path), tmp_path / "work", Settings(*settings), 2)
    likelihoods, tensions = FAST_ALIGN[settings]
    assert _figures(caplog.text) == (likelihoods, tensions)
    assert float(f"{tension:g}") == (tensions[-1] if tensions else fastalign_em.INITIAL_TENSION)
    assert list(Path(tmp_path / "work").iterdir()) == []  # the chunks' files are removed


@needs_reference
def test_links_of_every_pair_are_the_binarys_but_a_few(tmp_path, caplog):
    """All 29,000 pairs, as fast_align's binary aligned them (its forward.links): fast_align's
    figures, and 6 lines whose links differ, where two runs of the binary differ on 7."""
    caplog.set_level(logging.INFO)
    out = io.BytesIO()
    try:
        fastalign.align(str(REFERENCE / "corpus.en-de"), Settings(True, True, True), out, workers=2)
    finally:
        gc.unfreeze()
    assert _figures(caplog.text) == FAST_ALIGN_FULL
    ours = out.getvalue().decode("utf-8").splitlines()
    binary = (REFERENCE / "forward.links").read_text(encoding="utf-8").splitlines()
    assert len(ours) == len(binary) == 29_000
    assert sum(a != b for a, b in zip(ours, binary)) <= 7


@needs_reference
def test_the_model_is_the_same_for_any_number_of_workers(tmp_path, monkeypatch):
    """Chunks of 700 pairs read, cut into chunks of 20,000 cells, trained by 1, 2 or 3
    workers: the same tables, bit for bit (the sums go in chunk order whoever computes them),
    and the same tension. Chunks of another size add in another order: equal to rounding."""
    corpus = _subset(tmp_path, 3000)
    monkeypatch.setattr(fastalign_em, "CHUNK_PAIRS", 700)
    monkeypatch.setattr(fastalign_em, "CHUNK_CELLS", 20_000)
    models = [_train(corpus, tmp_path / f"w{workers}", Settings(True, True, True), workers)
              for workers in (1, 2, 3)]
    for table, tension in models[1:]:
        assert table.ids == models[0][0].ids and tension == models[0][1]
        assert np.array_equal(table.keys, models[0][0].keys)
        assert table.probs.tobytes() == models[0][0].probs.tobytes()
    monkeypatch.setattr(fastalign_em, "CHUNK_PAIRS", 3000)
    table, tension = _train(corpus, tmp_path / "one", Settings(True, True, True), 2)
    assert np.array_equal(table.keys, models[0][0].keys)
    assert tension == pytest.approx(models[0][1], rel=1e-12)
    assert np.allclose(table.probs, models[0][0].probs, rtol=1e-9, atol=0)


def test_pieces_bound_the_cells_and_keep_every_pair():
    """A chunk cut by cells: every pair once, in order, with its words; each piece within its
    last pair's cells past the bound; a pair longer than the bound ends its piece."""
    rng = np.random.default_rng(0)
    n, m = rng.integers(1, 40, 500, dtype=np.int32), rng.integers(1, 40, 500, dtype=np.int32)
    m[100] = n[100] = 200  # 40,200 cells alone
    chunk = Chunk(n, m, rng.integers(2, 10**6, n.sum(), dtype=np.int32),
                  rng.integers(2, 10**6, m.sum(), dtype=np.int32))
    bound = 5_000
    cut = pieces(chunk, bound)

    for side in Chunk._fields:
        assert np.array_equal(np.concatenate([getattr(piece, side) for piece in cut]), getattr(chunk, side))
    for piece in cut:
        assert len(piece.m) and piece.source.size == piece.n.sum() and piece.target.size == piece.m.sum()
        sizes = piece.m.astype(np.int64) * (piece.n + 1)
        assert sizes[:-1].sum() < bound


def test_the_model_al_feat_is_fast_aligns():
    """fast_align's "model al-feat" at tension 4 for corpora of one pair shape (m target, n
    source words): its ComputeDLogZ divides by ComputeZ(j, n, m), m and n swapped, with
    unsigned arithmetic. The exact expectation agrees only where m == n."""
    fast_align = {(1, 2): -0.5, (2, 1): -0.0298007, (3, 2): -0.0974115, (2, 3): -0.291192,
                  (5, 3): -0.0933619, (3, 5): -0.315975, (7, 5): -0.116971, (4, 4): -0.130654}
    for (m, n), expected in fast_align.items():
        j = np.arange(1, m + 1)
        ours = expected_feature(j, np.full(m, m), np.full(m, n), 4.0).mean()
        assert float(f"{ours:g}") == expected, (m, n)
        i = np.arange(1, n + 1)[:, None]
        weights = np.exp(-4.0 * np.abs(i / n - j / m))
        exact = (-np.abs(i / n - j / m) * weights / weights.sum(axis=0)).sum(axis=0).mean()
        assert (abs(exact - ours) < 1e-9) == (m == n), (m, n)


def test_digamma_is_fast_aligns_series():
    values = {1.0: -0.5772156649015329, 0.5: -1.9635100260214235, 0.01: -100.56088545786867,
              10.0: 2.251752589066721, 1e6: 13.815510057964273}
    assert np.allclose(digamma(np.array(list(values))), list(values.values()), rtol=1e-10, atol=0)


def test_words_end_at_spaces_and_tabs_only_as_in_fast_align():
    """A no-break space or another Unicode space is part of a word, as fast_align reads bytes."""
    assert split_pair("a\u00a0b  c\td ||| e\u2009f") == (["a\u00a0b", "c", "d"], ["e\u2009f"])
    assert split_pair("a b |||") == (["a", "b"], [])


@pytest.mark.parametrize("line, problem", [(b"a b ||| ", "a side is empty"),
                                           (b"caf\xe9 ||| Kaffee", "not valid UTF-8")])
def test_a_line_fast_align_would_stop_at_is_one_clear_error(tmp_path, line, problem):
    corpus = tmp_path / "corpus"
    corpus.write_bytes(b"the dog ||| der Hund\n" * 2 + line + b"\n" + b"a cat ||| eine Katze\n")
    proc = subprocess.run([sys.executable, "-m", "convs2s_preprocess.aligner.fastalign", "-i", str(corpus),
                           "-d", "-o", "-v", "--workers", "2"], cwd=ROOT, capture_output=True,
                          text=True)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.splitlines()[-1] == f"{corpus}, line 3: {problem}"
    assert "Traceback" not in proc.stderr
