"""A checkpoint whose bytes changed, or that was cut short, is named before it is used.

torch's reader never checks the CRC-32 its zip container keeps for every member: 400 bytes
flipped inside the tensor data loaded, and training resumed with other losses. With the plugin,
resuming, fairseq-generate, the hub and averaging refuse such a file in one line that names
it, the damage, and the newest intact checkpoint beside it.
"""
import shutil
import zipfile

import pytest
import torch

import fairseq_convs2s_ext
from cli_helpers import run
from fairseq_convs2s_ext import ConvS2SModel
from fairseq_convs2s_ext.checkpoints import UnreadableCheckpoint, load_checkpoint
from fairseq_convs2s_ext.checkpoints.integrity import damage
from tiny_runs import train

USER_DIR = fairseq_convs2s_ext.__path__[0]


@pytest.fixture(scope="module")
def run_folder(small_bin, tmp_path_factory):
    """A real training's folder: checkpoint_1_5.pt, checkpoint_2_10.pt, checkpoint_last.pt."""
    save_dir = tmp_path_factory.mktemp("run")
    train(small_bin, save_dir, "--max-update", "12", "--save-interval-updates", "5", "--no-epoch-checkpoints",
          "--disable-validation")
    return save_dir


def flipped(path, count=400):
    """XOR ``count`` bytes in the middle of the largest member's data (a tensor's bytes)."""
    with zipfile.ZipFile(path) as archive:
        member = max(archive.infolist(), key=lambda m: m.compress_size)
        name_and_extra = len(member.filename.encode()) + len(member.extra)
    start = member.header_offset + 30 + name_and_extra + member.compress_size // 2 - count // 2
    data = bytearray(path.read_bytes())
    data[start:start + count] = bytes(b ^ 0x5A for b in data[start:start + count])
    path.write_bytes(bytes(data))
    return member.filename


@pytest.fixture
def damaged(run_folder, tmp_path):
    """A copy of the run folder whose checkpoint_last.pt has 400 bytes flipped."""
    folder = tmp_path / "run"
    shutil.copytree(run_folder, folder)
    member = flipped(folder / "checkpoint_last.pt")
    return folder, member


def test_flipped_bytes_are_found_and_the_newest_intact_checkpoint_named(damaged):
    folder, member = damaged
    problem = damage(str(folder / "checkpoint_last.pt"))
    assert problem is not None and member in problem and "CRC" in problem
    assert damage(str(folder / "checkpoint_2_10.pt")) is None
    with pytest.raises(UnreadableCheckpoint, match=r"checkpoint_last\.pt: damaged: .* the newest intact "
                                                   r"checkpoint beside it is .*checkpoint_2_10\.pt"):
        load_checkpoint(str(folder / "checkpoint_last.pt"))


def test_generation_and_the_hub_refuse_a_damaged_checkpoint(damaged, small_bin):
    """fairseq-generate with the plugin and fairseq's own task; the plugin's hub."""
    folder, _ = damaged
    output = run("fairseq-generate", small_bin, "--user-dir", USER_DIR, "--path", folder / "checkpoint_last.pt",
                 "--gen-subset", "test", "--beam", "2", check=False)
    assert output.returncode != 0 and "Traceback" not in output.stdout, output.stdout[-3000:]
    assert f"fairseq-generate: error: {folder / 'checkpoint_last.pt'}: damaged" in output.stdout
    assert "checkpoint_2_10.pt" in output.stdout
    with pytest.raises(UnreadableCheckpoint, match="damaged"):
        ConvS2SModel.from_pretrained(str(folder), checkpoint_file="checkpoint_last.pt",
                                     data_name_or_path=str(small_bin))


def test_resuming_refuses_a_damaged_checkpoint_last(damaged, small_bin):
    """Before: training resumed from the flipped weights with other losses."""
    folder, _ = damaged
    output = run(
        "fairseq-train", small_bin, "--user-dir", USER_DIR, "--task", "convs2s_translation", "--arch", "convs2s_tiny",
        "--optimizer", "nag", "--lr", "0.25", "--criterion", "convs2s_cross_entropy", "--max-tokens", "1000",
        "--save-dir", folder, "--max-update", "14", "--disable-validation", "--num-workers", "0", check=False)
    assert output.returncode != 0 and "Traceback" not in output.stdout, output.stdout[-3000:]
    assert f"{folder / 'checkpoint_last.pt'}: damaged" in output.stdout
    assert "checkpoint_2_10.pt" in output.stdout


def test_averaging_refuses_a_damaged_checkpoint(damaged, tmp_path):
    folder, _ = damaged
    output = run("convs2s-average-checkpoints", "--inputs", folder / "checkpoint_last.pt",
                 folder / "checkpoint_1_5.pt", "-o", tmp_path / "avg.pt", check=False)
    assert output.returncode == 1 and "damaged" in output.stdout and not (tmp_path / "avg.pt").exists()


def test_a_truncated_checkpoint_last_points_elsewhere(run_folder, tmp_path):
    """The old message suggested checkpoint_last.pt as the way out of a truncated checkpoint_last.pt."""
    folder = tmp_path / "run"
    shutil.copytree(run_folder, folder)
    last = folder / "checkpoint_last.pt"
    last.write_bytes(last.read_bytes()[:5000])
    with pytest.raises(UnreadableCheckpoint) as raised:
        load_checkpoint(str(last))
    message = str(raised.value)
    assert "cut short" in message and message.count("checkpoint_last.pt") == 1, message
    assert "checkpoint_2_10.pt" in message


def test_a_legacy_checkpoint_has_no_checksums_and_loads(tmp_path):
    """torch's format before 1.6 (the released fconv models) is read as it is."""
    path = tmp_path / "legacy.pt"
    torch.save({"model": {"w": torch.ones(3)}}, path, _use_new_zipfile_serialization=False)
    assert damage(str(path)) is None
    assert torch.equal(load_checkpoint(str(path))["model"]["w"], torch.ones(3))
