"""Which of fairseq's commands, if any, runs the plugin: what the plugin does when it is
imported depends on it (the package's ``__init__``), and so do the task's checks and the
model's warning. Standard library only: every module may import it."""
import os
import sys


def fairseq_command() -> str:
    """The fairseq_cli module the program Python runs (``train`` for its console script
    ``fairseq-train`` or for ``python -m fairseq_cli.train``), or "" for any other program."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None:
        return spec.name.split(".", 1)[1] if spec.name.startswith("fairseq_cli.") else ""
    name = os.path.basename(sys.argv[0]) if sys.argv else ""
    return name[len("fairseq-"):].replace("-", "_") if name.startswith("fairseq-") else ""


def runs_fairseq_command() -> bool:
    """Whether the program Python runs is one of fairseq's commands."""
    return bool(fairseq_command())
