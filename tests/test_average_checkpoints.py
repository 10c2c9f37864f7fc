"""convs2s-average-checkpoints on two real checkpoints of a tiny model (fairseq-train, Multi30k)."""
import pytest
import torch
from fairseq import checkpoint_utils

import fairseq_convs2s_ext  # noqa: F401  (checkpoints load with weights_only)
from fairseq_convs2s_ext.cli.average_checkpoints import main
from tiny_runs import prepare, train


def average(capsys, *args):
    """convs2s-average-checkpoints ARGS: (exit status, stdout, stderr)."""
    status = main([str(arg) for arg in args])
    return (status, *capsys.readouterr())


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, data_dir):
    work = tmp_path_factory.mktemp("average")
    prepared = prepare(data_dir, work, "--no-bpe")
    train(prepared / "bin", work / "checkpoints", "--max-update", "4", "--save-interval-updates", "2",
          "--disable-validation")
    return work / "checkpoints"


def test_the_averaged_weights_are_the_mean(checkpoints, tmp_path, capsys):
    out = tmp_path / "averaged.pt"
    status, stdout, stderr = average(capsys, "--inputs", checkpoints, "--num-update-checkpoints", "2", "-o", out)
    assert status == 0, stderr
    assert "the average of 2 checkpoints" in stdout
    first, second, averaged = (torch.load(p, map_location="cpu", weights_only=True)
                               for p in (checkpoints / "checkpoint_1_2.pt", checkpoints / "checkpoint_1_4.pt", out))
    assert set(averaged["model"]) == set(first["model"])
    changed = [key for key in first["model"] if not torch.equal(first["model"][key], second["model"][key])]
    assert len(changed) > len(first["model"]) // 2  # two updates apart: most weights differ
    for key, value in averaged["model"].items():
        if value.is_floating_point():
            assert torch.allclose(value, (first["model"][key] + second["model"][key]) / 2, atol=1e-7), key
        else:  # the dictionary fingerprints: the same in both, kept as they are
            assert value.dtype == first["model"][key].dtype and torch.equal(value, first["model"][key]), key
    assert averaged["extra_state"]["train_iterator"] == first["extra_state"]["train_iterator"]
    # fairseq loads it as any other checkpoint.
    models, _ = checkpoint_utils.load_model_ensemble([str(out)])
    assert torch.equal(models[0].state_dict()["decoder.fc2.bias"], averaged["model"]["decoder.fc2.bias"])
    # The same two files given by name.
    by_name = tmp_path / "by_name.pt"
    assert average(capsys, "--inputs", checkpoints / "checkpoint_1_2.pt", checkpoints / "checkpoint_1_4.pt", "-o", by_name)[0] == 0
    assert all(torch.equal(v, torch.load(by_name, weights_only=True)["model"][k]) for k, v in averaged["model"].items())


def test_epoch_checkpoints_asked_of_a_folder_of_update_checkpoints_say_what_it_holds(checkpoints, tmp_path, capsys):
    status, _, stderr = average(capsys, "--inputs", checkpoints, "--num-epoch-checkpoints", "5", "-o", tmp_path / "a.pt")
    assert status == 1
    assert stderr.strip().splitlines() == [
        f"convs2s-average-checkpoints: error: {checkpoints}: 5 epoch checkpoints requested, found no epoch "
        f"checkpoints; found 2 update checkpoints (checkpoint_1_2.pt checkpoint_1_4.pt): use --num-update-checkpoints"]


def test_checkpoints_of_different_models_are_refused(checkpoints, tmp_path, capsys):
    other = torch.load(checkpoints / "checkpoint_1_4.pt", weights_only=True)
    other["model"]["decoder.extra.weight"] = torch.zeros(2)
    torch.save(other, tmp_path / "other.pt")
    out = tmp_path / "averaged.pt"
    status, _, stderr = average(capsys, "--inputs", checkpoints / "checkpoint_1_2.pt", tmp_path / "other.pt", "-o", out)
    assert status == 1 and "other.pt: its parameters are not those of" in stderr
    status, _, stderr = average(capsys, "--inputs", checkpoints / "checkpoint_1_2.pt", tmp_path / "none.pt", "-o", out)
    assert status == 1 and "none.pt: no such file" in stderr
    status, _, stderr = average(capsys, "--inputs", checkpoints, "--num-update-checkpoints", "3", "-o", out)
    assert status == 1 and "3 update checkpoints requested, found 2 update checkpoints (checkpoint_1_2.pt" in stderr
    status, _, stderr = average(capsys, "--inputs", checkpoints, "-o", out)
    assert status == 1 and "needs --num-epoch-checkpoints" in stderr
    assert not out.exists()
