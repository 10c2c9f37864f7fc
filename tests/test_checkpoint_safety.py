"""fairseq checkpoints load under torch's weights_only unpickler; code in a checkpoint does not run."""
import argparse
import os

import pytest
import torch
from fairseq import checkpoint_utils

import fairseq_convs2s_ext  # noqa: F401  (allows fairseq's config classes)
from model_helpers import build


class RunsCode:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


def test_fairseq_checkpoint_loads_with_weights_only(tmp_path):
    model, _ = build()
    path = tmp_path / "checkpoint.pt"
    # The layout of fairseq's argparse-era checkpoints, such as the released fconv models.
    history = [{"criterion_name": "CrossEntropyCriterion", "optimizer_name": "NAG",
                "lr_scheduler_state": {"best": 1.5}, "num_updates": 10}]
    torch.save({"args": argparse.Namespace(arch="convs2s_tiny", task="translation"), "model": model.state_dict(),
                "optimizer_history": history, "extra_state": {"train_iterator": {"epoch": 2}}}, path)
    state = checkpoint_utils.load_checkpoint_to_cpu(str(path))
    assert state["cfg"].model._name == "convs2s_tiny"
    assert set(state["model"]) == set(model.state_dict())


def test_a_checkpoint_cannot_run_code(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "evil.pt"
    torch.save({"model": {}, "payload": RunsCode()}, path)
    with pytest.raises(Exception, match="Weights only load failed"):
        checkpoint_utils.load_checkpoint_to_cpu(str(path))
    assert not (tmp_path / "pwned").exists()
