"""One clear line, not a traceback, for the errors a user of fairseq's commands can fix.

fairseq's commands (fairseq-generate, fairseq-interactive, fairseq-train) let whatever a
load raises end the program with a traceback: a checkpoint that is truncated (a disk that
filled up while fairseq copied ``checkpoint_best.pt``), random bytes, refused by torch's
safe unpickler or by the plugin; a ``--replace-unk`` dictionary with a malformed line
(fairseq's ``utils.load_align_dict`` raises a bare IndexError); ``--replace-unk`` without
``--dataset-impl raw`` (fairseq's bare AssertionError), or with fairseq's own task, whose
replacement is broken for every model (an IndexError in ``utils.replace_unk``); a
``--vocab-selection`` candidates file that does not fit, or a selection option out of range,
which the task reports when fairseq sets it up; the usual slips: a data folder that is missing,
or that is convs2s-prepare's folder where its ``bin/`` was meant, a folder given as ``--path``,
fairseq-interactive's ``--input`` missing, a folder or not UTF-8; and, under fairseq's own task
(the plugin's refuses them before fairseq reads the split, :mod:`.data.splits`), a split with a
binarized file missing or a sentence longer than the model takes. None of their hooks runs
around those loads, so the plugin reports them where Python reports an uncaught exception:
:func:`install_excepthook` puts a ``sys.excepthook`` in front of the one in place, which
prints ``PROGRAM: error: PATH: why`` for these errors (:func:`describe`; a checkpoint's
problem as the plugin's commands word it, :func:`..checkpoints.errors.why_unreadable`) and
hands every other one on unchanged. The file is found in the traceback: the one
``torch.load`` was reading (its argument ``f``), or the ``--replace-unk`` file fairseq was
reading.

The hook is installed for commands only, never by importing the package into a program of
one's own, whose errors stay its own. The plugin's commands that load checkpoints through
fairseq (convs2s-plot-attention, convs2s-recipe) install it in their ``main``; the others read
them with :func:`..checkpoints.load_checkpoint` and report its errors themselves. fairseq's
commands offer no hook for it: they import ``--user-dir`` with ``utils.import_user_module``,
which fairseq's hub calls in a program of one's own too, and run nothing of a plugin's for
the command as such. So the package installs the hook as it is imported if
:func:`.command.runs_fairseq_command`: if the program Python runs is fairseq's own, a console script
``fairseq-*`` or ``python -m fairseq_cli.COMMAND``.
"""
import atexit
import logging
import os
import sys
from typing import Optional

from .checkpoints.errors import CheckpointError, why_unreadable
from .data.binarized import BinarizedDataError
from .data.source_text import SourceTextError
from .data.splits import SplitError, missing_files, too_long
from .data.vocabulary_selection import CandidatesFileError, SelectionOptionError
from .generation.fairseq_options import GenerationOptionError
from .generation.quantization import QuantizeOptionError
from .generation.unknown_words import AlignDictError, read_align_dict
from .hardware import Bf16OptionError, Bf16UnsupportedError

_TORCH_LOAD = os.path.join("torch", "serialization.py")
_FAIRSEQ_UTILS = os.path.join("fairseq", "utils.py")
_FAIRSEQ_CHECKPOINTS = os.path.join("fairseq", "checkpoint_utils.py")
_FAIRSEQ_DICTIONARY = os.path.join("fairseq", "data", "dictionary.py")
_FAIRSEQ_TRANSLATION = os.path.join("fairseq", "tasks", "translation.py")
_FAIRSEQ_TRAINER = os.path.join("fairseq", "trainer.py")
_FAIRSEQ_TASK = os.path.join("fairseq", "tasks", "fairseq_task.py")
_FAIRSEQ_INTERACTIVE = os.path.join("fairseq_cli", "interactive.py")
# Errors of the plugin whose message says what is wrong and what to do.
_OURS = (CheckpointError, AlignDictError, SourceTextError, CandidatesFileError, SelectionOptionError,
         Bf16UnsupportedError, Bf16OptionError, BinarizedDataError, SplitError, GenerationOptionError,
         QuantizeOptionError)
_REPLACE_UNK = ("--replace-unk needs --task convs2s_translation (fairseq's own replacement is broken "
                "for every model) and the words of the test sentences: add --dataset-impl raw, which "
                "reads SPLIT.SRC-TGT.LANG beside the binaries (convs2s-prepare keeps them)")


def _frame_local(tb, function: str, filename_end: str, name: str):
    """``name`` in the innermost frame of ``function`` (in a file ending ``filename_end``)."""
    value = None
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_name == function and code.co_filename.endswith(filename_end):
            value = tb.tb_frame.f_locals.get(name)
        tb = tb.tb_next
    return value


def checkpoint_being_read(tb) -> Optional[str]:
    """The file that ``torch.load`` was reading when the exception of ``tb`` was raised."""
    f = _frame_local(tb, "load", _TORCH_LOAD, "f")
    path = f if isinstance(f, (str, os.PathLike)) else getattr(f, "name", None)
    return None if path is None else os.fspath(path)


def _align_dict_error(exc: BaseException, tb) -> Optional[str]:
    """What is wrong with the --replace-unk file that failed to load."""
    if isinstance(exc, AlignDictError):
        return str(exc)
    path = _frame_local(tb, "load_align_dict", _FAIRSEQ_UTILS, "replace_unk")
    if not isinstance(path, str):
        return None
    try:
        read_align_dict(path)
    except AlignDictError as e:
        return str(e)
    return None


def _plugin_error(exc: BaseException) -> Optional[Exception]:
    """An error of the plugin that is ``exc`` or that ``exc`` was raised from or while handling
    (fairseq-train re-raises load_state_dict's errors as a bare Exception)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, _OURS):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def _missing_checkpoint(exc: BaseException, tb) -> Optional[str]:
    """A ``--path`` file that does not exist (fairseq's bare ``IOError`` after its check)."""
    path = _frame_local(tb, "load_model_ensemble_and_task", _FAIRSEQ_CHECKPOINTS, "filename")
    if isinstance(exc, OSError) and isinstance(path, str) and str(exc).startswith("Model file not found"):
        return f"{path}: no such checkpoint file (--path; an ensemble: --path a.pt:b.pt)"
    return None


def _checkpoint_folder(exc: BaseException, tb) -> Optional[str]:
    """A folder given as --path (fairseq's bare IsADirectoryError): the hub takes the folder,
    the commands a file in it."""
    path = _frame_local(tb, "load_model_ensemble_and_task", _FAIRSEQ_CHECKPOINTS, "filename")
    if not isinstance(exc, IsADirectoryError) or not isinstance(path, str) or not os.path.isdir(path):
        return None
    found = sorted(name for name in os.listdir(path) if name.endswith(".pt"))
    example = os.path.join(path, "checkpoint_best.pt" if "checkpoint_best.pt" in found or not found else found[0])
    held = f"it holds {', '.join(found)}" if found else "it holds no .pt file"
    return f"{path}: a folder, not a checkpoint: --path takes a file, e.g. {example} ({held})"


def _interactive_input(exc: BaseException, tb) -> Optional[str]:
    """fairseq-interactive's --input that cannot be read: missing, a folder, not UTF-8."""
    path = _frame_local(tb, "buffered_read", _FAIRSEQ_INTERACTIVE, "input")
    if path == "-" and isinstance(exc, UnicodeDecodeError):  # stdin decoded strictly (a locale's choice)
        return (f"stdin: not UTF-8 (byte {exc.object[exc.start]:#04x}): give UTF-8 input, e.g. convert it with "
                f"iconv -f ISO-8859-1 -t UTF-8 (from its real encoding)")
    if not isinstance(path, str) or path == "-":
        return None
    if isinstance(exc, IsADirectoryError) or (isinstance(exc, OSError) and os.path.isdir(path)):
        return f"{path}: a folder, not a file: --input takes a file of sentences, one a line (or - for stdin)"
    if isinstance(exc, FileNotFoundError):
        return f"{path}: no such file (--input: a file of sentences, one a line; leave it out to read stdin)"
    if isinstance(exc, UnicodeDecodeError):
        return f"{path}: {_not_utf8(path)}"
    return None


def _not_utf8(path: str) -> str:
    """Where ``path`` stops being UTF-8, and the fix (Python's decoding error names neither the
    line nor the file)."""
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as e:
                return (f"line {number} is not UTF-8 (byte {raw[e.start]:#04x} at byte {e.start} of the line): "
                        f"convert the file to UTF-8, e.g. iconv -f ISO-8859-1 -t UTF-8 (with its real encoding)")
    return "not UTF-8: convert the file to UTF-8, e.g. iconv -f ISO-8859-1 -t UTF-8 (with its real encoding)"


def _data_folder(exc: BaseException, tb) -> Optional[str]:
    """The data folder of fairseq's translation task that is missing, or that is the folder
    convs2s-prepare wrote, whose binarized data is in its ``bin/``."""
    paths = _frame_local(tb, "setup_task", _FAIRSEQ_TRANSLATION, "paths")
    if not paths or not (isinstance(exc, OSError) or "Could not infer language pair" in str(exc)):
        return None
    folder, binarized = paths[0], os.path.join(paths[0], "bin")
    if not os.path.isdir(folder):
        what = "a file, not a folder" if os.path.exists(folder) else "no such folder"
        return (f"{folder}: {what}: pass the folder of the binarized data (convs2s-prepare -o OUT writes it in "
                f"OUT/bin, fairseq-preprocess in its --destdir)")
    if os.path.isdir(binarized) and not any(name.startswith("dict.") for name in os.listdir(folder)):
        return f"{folder}: the binarized data is in {binarized} (where convs2s-prepare writes it): pass {binarized}"
    return None


def _missing_split(exc: BaseException, tb) -> Optional[str]:
    """A split with a file missing, under fairseq's own task: its "Dataset not found" (a source
    file), or the model's TypeError after training on sources alone (a target file)."""
    found = _frame_local(tb, "load_langpair_dataset", _FAIRSEQ_TRANSLATION, "split")
    if isinstance(exc, FileNotFoundError) and found is not None and "Dataset not found" in str(exc):
        local = {name: _frame_local(tb, "load_langpair_dataset", _FAIRSEQ_TRANSLATION, name)
                 for name in ("data_path", "src", "tgt", "dataset_impl")}
        return missing_files(local["data_path"], found, local["src"], local["tgt"], local["dataset_impl"])
    trainer = _frame_local(tb, "train_step", _FAIRSEQ_TRAINER, "self") or _frame_local(
        tb, "valid_step", _FAIRSEQ_TRAINER, "self")
    if not isinstance(exc, TypeError) or "prev_output_tokens" not in str(exc) or trainer is None:
        return None
    task = trainer.task
    for split, dataset in task.datasets.items():
        if getattr(dataset, "tgt", True) is None:  # a language pair without its target side
            return missing_files(task.cfg.data.split(os.pathsep)[0], split, task.cfg.source_lang,
                                 task.cfg.target_lang, task.cfg.dataset_impl)
    return None


def _too_long(exc: BaseException, tb) -> Optional[str]:
    """A sentence longer than the model takes, under fairseq's own task ("Size of sample #N is
    invalid"; the plugin's task refuses it first)."""
    task = _frame_local(tb, "filter_indices_by_size", _FAIRSEQ_TASK, "self")
    if task is None or "is invalid" not in str(exc) or not hasattr(task, "datasets"):
        return None
    dataset = _frame_local(tb, "filter_indices_by_size", _FAIRSEQ_TASK, "dataset")
    split = next((name for name, loaded in task.datasets.items() if loaded is dataset), None)
    max_positions = _frame_local(tb, "filter_indices_by_size", _FAIRSEQ_TASK, "max_positions")
    return split and too_long(dataset, max_positions, task.cfg.data.split(os.pathsep)[0], split,
                              task.cfg.source_lang, task.cfg.target_lang, task.cfg.dataset_impl)


def _dictionary_error(exc: BaseException, tb) -> Optional[str]:
    """A dictionary file fairseq could not read (its messages do not name the file)."""
    f = _frame_local(tb, "add_from_file", _FAIRSEQ_DICTIONARY, "f")
    path = f if isinstance(f, str) else getattr(f, "name", None)
    if path is None or isinstance(exc, MemoryError):
        return None
    if isinstance(exc, FileNotFoundError):  # fairseq looks for dict.SRC.txt and dict.TGT.txt in the data folder
        return f"{path}: no such dictionary: the data folder must hold the dict.LANG.txt of each side (check -s/-t)"
    if isinstance(exc, OSError):
        return f"{path}: {exc.strerror or exc}"
    why = " ".join(str(exc).replace("\n", "").split())  # fairseq quotes the bad line with its newline
    return f"{path}: not a fairseq dictionary: {why}; use the dict.LANG.txt that fairseq-preprocess or convs2s-prepare wrote"


def _languages_unknown(exc: BaseException, tb) -> Optional[str]:
    """A data folder without binarized splits, from which fairseq cannot tell the languages."""
    paths = _frame_local(tb, "setup_task", os.path.join("fairseq", "tasks", "translation.py"), "paths")
    if paths and "Could not infer language pair" in str(exc):
        return (f"{paths[0]}: no binarized split (SPLIT.SRC-TGT.LANG.idx) from which to tell the languages: "
                f"pass -s SRC -t TGT, or the folder fairseq-preprocess or convs2s-prepare wrote")
    return None


def moses_without_languages(text: str) -> bool:
    """Whether ``text`` (an error of hydra's, or fairseq's log of the overrides it could not
    compose) is --tokenizer moses without the languages it needs."""
    return "tokenizer.source_lang=null" in text or "tokenizer.target_lang=null" in text


def _usage_error(exc: BaseException) -> Optional[str]:
    """Options that fairseq's configuration rejects with hydra's exception."""
    from hydra.errors import ConfigCompositionException

    if isinstance(exc, ConfigCompositionException) and moses_without_languages(str(exc)):
        return ("--tokenizer moses needs the languages of the data: add -s SRC -t TGT (e.g. -s en -t de), "
                "which the Moses tokenizer's rules depend on")
    return None


def describe(exc: BaseException, tb) -> Optional[str]:
    """``PATH: why`` (or what to change) for an error a user can fix, else None."""
    for known in (_missing_checkpoint(exc, tb), _checkpoint_folder(exc, tb), _interactive_input(exc, tb),
                  _data_folder(exc, tb), _missing_split(exc, tb), _too_long(exc, tb), _dictionary_error(exc, tb),
                  _languages_unknown(exc, tb), _usage_error(exc)):
        if known:
            return known
    align_dict_error = _align_dict_error(exc, tb)
    if align_dict_error:
        return align_dict_error
    stock_replacement = (isinstance(exc, AssertionError) and "--replace-unk requires" in str(exc)) or (
        isinstance(exc, IndexError) and _frame_local(tb, "replace_unk", _FAIRSEQ_UTILS, "hypo_str") is not None)
    if stock_replacement:
        return _REPLACE_UNK
    ours = _plugin_error(exc)
    if ours is not None:  # the file torch.load was reading, or the checkpoint fairseq was loading
        path = checkpoint_being_read(ours.__traceback__) or _frame_local(
            tb, "load_model_ensemble_and_task", _FAIRSEQ_CHECKPOINTS, "filename")
        return f"{path}: {ours}" if path and not str(ours).startswith(f"{path}:") else str(ours)
    path = checkpoint_being_read(tb)
    return None if path is None else why_unreadable(exc, path)


def _not_the_overrides_of_a_reported_error(record: logging.LogRecord) -> bool:
    """fairseq logs every override (a line of 10,000 characters) before it raises hydra's
    error; the excepthook says what is wrong with the one that failed."""
    return not moses_without_languages(record.getMessage())


def exit_now(status: int) -> None:
    """End the command with ``status`` after running its exit handlers (logging's, the save-dir
    lock's), but without finalizing the interpreter: fairseq leaves its batch prefetcher's
    daemon thread running when training stops with an error, and a daemon thread inside torch
    at finalization is unwound through C++ and aborts the process ("terminate called without an
    active exception", SIGABRT) after the one line. ``atexit._run_exitfuncs`` is the one way to
    run the handlers: tests/test_usual_mistakes.py fails if it changes."""
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def install_excepthook() -> None:
    """Report these errors in one line (exit status 1); others as before."""
    previous = sys.excepthook
    if getattr(previous, "reports_checkpoint_errors", False):
        return
    logging.getLogger("fairseq.dataclass.utils").addFilter(_not_the_overrides_of_a_reported_error)

    def excepthook(exc_type, exc, tb):
        message = describe(exc, tb)
        if message is None:
            return previous(exc_type, exc, tb)
        program = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
        print(f"{program}: error: {message}", file=sys.stderr)
        exit_now(1)

    excepthook.reports_checkpoint_errors = True
    sys.excepthook = excepthook
