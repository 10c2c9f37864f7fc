"""What the plugin checks when a checkpoint is read: no code (``safe_loading``), the
dictionaries it was trained with (``dictionaries``), one clear line for a file that cannot be
used (``errors``, reported by :mod:`..excepthook`)."""
from .dictionaries import check_fingerprint, fingerprint
from .errors import CheckpointError, CheckpointRefused, DictionaryMismatch
from .safe_loading import allow_fairseq_checkpoints, check_config

__all__ = [
    "CheckpointError", "CheckpointRefused", "DictionaryMismatch", "allow_fairseq_checkpoints",
    "check_config", "check_fingerprint", "fingerprint",
]
