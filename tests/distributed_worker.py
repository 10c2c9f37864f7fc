"""One worker of a distributed fairseq-train run, for tests/test_distributed.py.

    python tests/distributed_worker.py OUT.pt [fairseq-train arguments ...]

Runs fairseq-train's real entry point (``fairseq_cli.train.cli_main``, which goes through
``fairseq.distributed.utils.call_main``) in this process, unchanged. fairseq saves
checkpoints on rank 0 only, so to compare every rank's parameters this script keeps a
reference to the model fairseq builds: it wraps OUR model class's ``build_model``
classmethod (fairseq itself is not patched) and, once training has returned, saves to OUT.pt

* ``initial``: the parameters as built (before any update),
* ``final``: the parameters after training,
* ``batches``: (sentences, fingerprint of the source tokens) of every training batch this
  rank's model ran forward on,
* ``rank`` and ``world_size`` as torch.distributed reports them.
"""
import hashlib
import sys

import torch

from fairseq_convs2s_ext.models.convs2s import ConvS2SModel

built = []


def _keep_built_model():
    original = ConvS2SModel.build_model.__func__

    def build_model(cls, args, task):
        model = original(cls, args, task)
        built.append(model)
        model.initial_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        model.batches = []
        model.register_forward_pre_hook(_record_batch, with_kwargs=True)
        return model

    ConvS2SModel.build_model = classmethod(build_model)


def _record_batch(model, args, kwargs):
    if model.training:  # training steps only, not validation
        src_tokens = kwargs["src_tokens"] if "src_tokens" in kwargs else args[0]
        tokens = src_tokens.detach().cpu().contiguous()
        digest = hashlib.sha1(f"{tuple(tokens.shape)}".encode() + tokens.numpy().tobytes()).hexdigest()
        model.batches.append((tokens.shape[0], digest))


def main():
    out, sys.argv = sys.argv[1], [sys.argv[0], *sys.argv[2:]]
    _keep_built_model()

    from fairseq_cli.train import cli_main
    cli_main()

    if len(built) != 1:
        raise SystemExit(f"expected fairseq to build one ConvS2S model, it built {len(built)}")
    model = built[0]
    distributed = torch.distributed.is_initialized()
    torch.save({
        "rank": torch.distributed.get_rank() if distributed else 0,
        "world_size": torch.distributed.get_world_size() if distributed else 1,
        "initial": model.initial_state,
        "final": {k: v.detach().cpu().clone() for k, v in model.state_dict().items()},
        "batches": model.batches,
    }, out)


if __name__ == "__main__":
    main()
