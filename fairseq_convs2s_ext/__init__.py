"""ConvS2S (Gehring et al., 2017) for fairseq, loaded with ``--user-dir "$(convs2s-user-dir)"``.

Importing the package registers the ``convs2s`` model and its architectures, the
``convs2s_cross_entropy`` criterion and the ``convs2s_translation`` task with fairseq (and
their configs with hydra, see :mod:`.hydra_configs`); lets fairseq's checkpoints load under
torch's safe ``weights_only`` unpickler while refusing any whose configuration could run
code (see :mod:`.checkpoints`). Imported by one of fairseq's commands as its ``--user-dir``,
it also reports a checkpoint or file that cannot be used in one line instead of a traceback
(see :mod:`.excepthook`), chooses torch's CPU threads (:mod:`.threads`), repairs fairseq's
logging and makes it readable (:mod:`.quiet`; fairseq-train saves its configuration beside
the checkpoints) and, with ``--help``, prints the options of the chosen task and architecture
(:mod:`.cli.fairseq_help`); imported into any other program, it changes none of these.
"""
import os

from .quiet import root_logging

_ROOT_LOGGING = root_logging()  # before fairseq is imported: see .quiet

from .checkpoints import allow_fairseq_checkpoints  # noqa: E402
from .command import runs_fairseq_command  # noqa: E402
from .excepthook import install_excepthook  # noqa: E402
from .hydra_configs import register_base_config  # noqa: E402
from .quiet import filter_warnings, readable_fairseq_logs, repair_fairseq_logging, undo_fairseq_basic_config  # noqa: E402,E501
from .threads import apply_to_command as choose_command_threads  # noqa: E402

USER_DIR = os.path.dirname(os.path.abspath(__file__))  # this package's folder: fairseq's --user-dir

allow_fairseq_checkpoints()
register_base_config(USER_DIR)
filter_warnings()  # only those the user can do nothing about (see .quiet)
if runs_fairseq_command():
    install_excepthook()
    repair_fairseq_logging()
    readable_fairseq_logs()  # the configuration readable (and saved by fairseq-train), no per-batch lines
    choose_command_threads()  # no more threads than idle cores, or OMP_NUM_THREADS (see .threads)

from . import criterions, models, tasks  # noqa: E402  (registers with fairseq)
from .models import ConvS2SModel  # noqa: E402

undo_fairseq_basic_config(_ROOT_LOGGING)  # fairseq's import-time logging.basicConfig(DEBUG)

__all__ = ["USER_DIR", "ConvS2SModel"]

if runs_fairseq_command():
    from .cli.fairseq_help import print_complete_help

    print_complete_help()  # with --help: also the options of --task, --arch, ... (see there)
