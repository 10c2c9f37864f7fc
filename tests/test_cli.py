"""The model end to end through fairseq's own commands on real text (Multi30k en-de)."""
import re
import subprocess

import pytest

from cli_helpers import PAPER_OPTIONS, hypotheses, run, valid_losses, write_lines
from conftest import BIN, ROOT

TRAIN_LINES, VALID_LINES, TEST_LINES = 3000, 200, 101  # 101: not a multiple of fairseq's batch multiple 8
MAX_POSITIONS = 40


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory, data_dir):
    """Multi30k en-de, whitespace-split, binarized by fairseq-preprocess with a joint dictionary."""
    work = tmp_path_factory.mktemp("multi30k")
    splits = {"train": ("train", TRAIN_LINES), "valid": ("val", VALID_LINES), "test": ("test_2016_flickr", TEST_LINES)}
    for split, (name, count) in splits.items():
        for lang in ("en", "de"):
            lines = (data_dir / "multi30k" / f"{name}.{lang}").read_text(encoding="utf-8").splitlines()[:count]
            write_lines(work / f"{split}.{lang}", lines)
    # A sentence longer than the model's positions, beside a normal one.
    long_en = " ".join(["a dog runs"] * 20)
    write_lines(work / "long.en", ["a dog runs .", long_en])
    write_lines(work / "long.de", ["ein hund rennt .", "ein hund rennt ."])
    run("fairseq-preprocess", "--source-lang", "en", "--target-lang", "de",
        "--trainpref", work / "train", "--validpref", work / "valid", "--testpref", f"{work / 'test'},{work / 'long'}",
        "--destdir", work / "bin", "--joined-dictionary", "--workers", "2")
    return work / "bin"


def train(data_bin, save_dir, *extra, cwd=ROOT, user_dir="fairseq_convs2s_ext", task="translation", check=True):
    return run(
        "fairseq-train", data_bin, "--user-dir", user_dir, "--task", task,
        "--criterion", "convs2s_cross_entropy", *PAPER_OPTIONS,
        "--max-tokens", "2000", "--save-dir", save_dir, "--no-progress-bar", "--log-interval", "10",
        "--seed", "1", "--num-workers", "0",
        "--max-source-positions", MAX_POSITIONS, "--max-target-positions", MAX_POSITIONS,
        "--skip-invalid-size-inputs-valid-test", *extra, cwd=cwd, check=check,
    )


@pytest.fixture(scope="module")
def trained(data_bin, tmp_path_factory):
    save_dir = tmp_path_factory.mktemp("checkpoints")
    log = train(data_bin, save_dir, "--arch", "convs2s_tiny", "--max-epoch", "3")
    return save_dir, log


def test_training_lowers_the_validation_loss(trained):
    _, log = trained
    losses = valid_losses(log)
    assert len(losses) == 3, log[-3000:]
    assert losses[-1] < losses[0] - 1.0, losses
    assert all(b < a for a, b in zip(losses, losses[1:])), losses


def test_training_resumes_from_the_checkpoint(data_bin, trained, tmp_path):
    save_dir, _ = trained
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    (resumed / "checkpoint_last.pt").write_bytes((save_dir / "checkpoint_last.pt").read_bytes())
    log = train(data_bin, resumed, "--arch", "convs2s_tiny", "--max-epoch", "4")
    assert re.search(r"Loaded checkpoint .*checkpoint_last\.pt \(epoch 4 @ \d+ updates\)", log), log[-3000:]
    assert len(valid_losses(log)) == 1  # only the fourth epoch ran


def test_generate_translates_every_test_sentence_with_beam_5(data_bin, trained):
    save_dir, _ = trained
    log = run("fairseq-generate", data_bin, "--user-dir", "fairseq_convs2s_ext", "--path", save_dir / "checkpoint_best.pt",
              "--beam", "5", "--batch-size", "32", "--required-batch-size-multiple", "1", "--gen-subset", "test")
    hyps = hypotheses(log)
    assert sorted(hyps) == list(range(TEST_LINES))
    assert sum(1 for h in hyps.values() if h.strip()) > 0.9 * TEST_LINES
    assert "BLEU4" in log


@pytest.fixture(scope="module")
def bf16_measured(data_bin, tmp_path_factory):
    """What ``--autocast-bf16 auto`` chose on this CPU for the tiny model, and why: bf16 only
    where fairseq-train's probe measured it faster than fp32. Native bf16 is not enough: on an
    Intel Xeon with AVX512_BF16 and no AMX it ran at 124.7 GFLOP/s against 222.6 in fp32. The
    probe's figures are cached per machine, so the runs after this one decide alike."""
    log = train(data_bin, tmp_path_factory.mktemp("bf16_auto"), "--arch", "convs2s_tiny", "--max-update", "1",
                "--autocast-bf16", "auto", task="convs2s_translation")
    decision = re.search(r"--autocast-bf16 auto: (bf16|fp32), because (bf16 matrix multiplies at the model's sizes "
                         r"ran at [\d.]+ GFLOP/s against [\d.]+ in fp32 on this CPU .*)$", log, flags=re.M)
    assert decision, log[-3000:]
    return decision.group(1) == "bf16", decision.group(2)


def test_bf16_autocast_trains_and_generates_on_cpu(data_bin, trained, bf16_measured, tmp_path):
    """--autocast-bf16 (convs2s_translation) on CPU, where fairseq's own --bf16 needs a TPU:
    the same validation losses as fp32 to within bf16 rounding, fp32 weights in the
    checkpoint, and every test sentence translated."""
    import torch

    import fairseq_convs2s_ext  # noqa: F401  (checkpoints load with weights_only)

    faster, why = bf16_measured
    if not faster:
        pytest.skip(f"--autocast-bf16 is refused here: {why}")
    _, fp32_log = trained
    log = train(data_bin, tmp_path, "--arch", "convs2s_tiny", "--max-epoch", "2",
                "--autocast-bf16", task="convs2s_translation")
    losses, fp32_losses = valid_losses(log), valid_losses(fp32_log)[:2]
    assert len(losses) == 2 and losses[1] < losses[0], log[-3000:]
    assert losses == pytest.approx(fp32_losses, rel=0.02), (losses, fp32_losses)
    state = torch.load(tmp_path / "checkpoint_last.pt", map_location="cpu")
    assert {t.dtype for t in state["model"].values() if t.is_floating_point()} == {torch.float32}
    generated = run("fairseq-generate", data_bin, "--user-dir", "fairseq_convs2s_ext", "--task", "convs2s_translation",
                    "--path", tmp_path / "checkpoint_best.pt", "--beam", "5", "--batch-size", "32",
                    "--gen-subset", "test", "--autocast-bf16")
    assert sorted(hypotheses(generated)) == list(range(TEST_LINES))


def test_bf16_autocast_is_refused_where_measured_slower_and_auto_takes_fp32(data_bin, trained, bf16_measured,
                                                                           tmp_path):
    """Where bf16 was measured slower (emulated, about a hundred times slower than fp32; or
    native but slower, as on a Xeon without AMX), fairseq-train and fairseq-generate stop at
    their first step with one line giving the figures and the alternatives, and
    ``--autocast-bf16 auto`` trains in fp32, saying why (the fixture)."""
    faster, why = bf16_measured
    if faster:
        pytest.skip(f"--autocast-bf16 runs here (test_bf16_autocast_trains_and_generates_on_cpu): {why}")
    save_dir, _ = trained
    refusal = (r"error: --autocast-bf16: bf16 matrix multiplies at the model's sizes ran at [\d.]+ GFLOP/s against "
               r"[\d.]+ in fp32 on this CPU \(.*(emulated|native)\): bf16 is not at least 1.1x faster; run without "
               r"--autocast-bf16 \(fp32\), or with --autocast-bf16 auto, which takes the faster$")
    trained_bf16 = train(data_bin, tmp_path, "--arch", "convs2s_tiny", "--max-update", "1",
                         "--autocast-bf16", task="convs2s_translation", check=False)
    generated = run("fairseq-generate", data_bin, "--user-dir", "fairseq_convs2s_ext", "--task", "convs2s_translation",
                    "--path", save_dir / "checkpoint_best.pt", "--beam", "5", "--gen-subset", "test",
                    "--autocast-bf16", check=False)
    for proc in (trained_bf16, generated):
        assert proc.returncode != 0
        assert re.search(refusal, proc.stdout, flags=re.M), proc.stdout[-3000:]
        assert "Traceback" not in proc.stdout
    assert not hypotheses(generated.stdout)


def test_too_long_input_is_an_error_or_skipped(data_bin, trained):
    save_dir, _ = trained
    args = ["fairseq-generate", data_bin, "--user-dir", "fairseq_convs2s_ext", "--path", save_dir / "checkpoint_best.pt",
            "--beam", "5", "--gen-subset", "test1", "--required-batch-size-multiple", "1"]
    failed = run(*args, check=False)
    assert failed.returncode != 0
    assert "skip-invalid-size-inputs-valid-test" in failed.stdout or "invalid" in failed.stdout
    skipped = run(*args, "--skip-invalid-size-inputs-valid-test")
    assert sorted(hypotheses(skipped)) == [0]


def test_user_dir_from_anywhere_and_paper_sized_model_trains(data_bin, tmp_path):
    """The installed package finds its own path; the paper's largest model (WMT'14 En-Fr) builds
    and takes a few updates on CPU."""
    user_dir = subprocess.run([BIN / "convs2s-user-dir"], check=True, capture_output=True, text=True).stdout.strip()
    assert (ROOT / "fairseq_convs2s_ext").samefile(user_dir)
    log = train(data_bin, tmp_path / "ckpt", "--arch", "convs2s_wmt_en_fr", "--max-update", "2", "--max-tokens", "300",
                "--disable-validation", "--no-save", cwd=tmp_path, user_dir=user_dir)
    assert "num. shared model params" in log or "num. model params" in log
    params = int(re.search(r"num\. (?:shared )?model params: ([\d,]+)", log)[1].replace(",", ""))
    assert params > 100_000_000, params
    assert re.search(r"num_updates 2\b", log), log[-3000:]
