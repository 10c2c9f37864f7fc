"""What the plugin checks when a checkpoint is read: no code (``safe_loading``, whose
``load_checkpoint`` the plugin's commands read with), the dictionaries it was trained with
(``dictionaries``), one clear line for a file that cannot be used (``errors``, reported by the
commands and by :mod:`..excepthook`). A training holds its ``--save-dir`` (``save_dir_lock``) and
copies checkpoints into it whole (``whole_copies``). ``fconv_import`` converts fairseq's fconv
checkpoints."""
from .dictionaries import check_fingerprint, fingerprint
from .errors import CheckpointError, CheckpointRefused, DictionaryMismatch, UnreadableCheckpoint, why_unreadable
from .safe_loading import allow_fairseq_checkpoints, check_config, load_checkpoint

__all__ = [
    "CheckpointError", "CheckpointRefused", "DictionaryMismatch", "UnreadableCheckpoint", "allow_fairseq_checkpoints",
    "check_config", "check_fingerprint", "fingerprint", "load_checkpoint", "why_unreadable",
]
