"""ConvS2S (Gehring et al., 2017) for fairseq, loaded with ``--user-dir fairseq_convs2s_ext``.

Importing the package registers the ``convs2s`` model and its architectures with fairseq (and
their configs with hydra, see :mod:`.hydra_configs`), and allows fairseq's checkpoints to load
under torch's safe ``weights_only`` unpickler.
"""
from .checkpoint_safety import allow_fairseq_checkpoints
from .hydra_configs import register_base_config

allow_fairseq_checkpoints()
register_base_config()

from . import criterions, models, tasks  # noqa: E402  (registers with fairseq)
from .models import ConvS2SModel  # noqa: E402

__all__ = ["ConvS2SModel"]
