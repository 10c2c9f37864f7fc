"""Child processes that stop with the command that started them.

A long external program (the word aligner) must not go on running, writing into a folder
that is being removed, once the command that started it is gone:

- SIGINT (Ctrl-C) and SIGTERM of the parent: :func:`exit_on_sigterm` turns SIGTERM into
  ``SystemExit`` as Python turns SIGINT into ``KeyboardInterrupt``, and :func:`run_child`
  kills the child's process group before the exception goes on, so the ``with`` blocks
  above it can remove the child's files. The child runs in its own process group, so that
  what it starts itself (``eflomal-align`` runs an ``eflomal`` binary) is killed with it.
- SIGKILL of the parent, which nothing can catch: on Linux the kernel kills the child
  (``prctl(PR_SET_PDEATHSIG, SIGKILL)``, set in the child before it runs the program).
  That reaches the child only, not the processes it started itself.
"""
import ctypes
import os
import signal
import subprocess
import sys
from typing import Callable, Optional, Sequence

PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def exit_on_sigterm() -> None:
    """Make SIGTERM raise ``SystemExit(143)``, so that cleanup runs as it does for Ctrl-C."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def die_with_parent() -> Optional[Callable[[], None]]:
    """A ``preexec_fn`` that has the kernel SIGKILL the child when this process dies (Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork
    parent = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the parent died before the request took effect
            os.kill(os.getpid(), signal.SIGKILL)
    return preexec


def run_child(cmd: Sequence[str], stdout, stderr, cwd: str, env: dict) -> int:
    """Run ``cmd`` to its end and return its exit status; it does not outlive this process."""
    proc = subprocess.Popen(cmd, stdout=stdout, stderr=stderr, cwd=cwd, env=env,
                            start_new_session=True, preexec_fn=die_with_parent())
    try:
        return proc.wait()
    finally:
        if proc.returncode is None:  # interrupted: stop the child and what it started
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def process_exists(pid: int) -> bool:
    """Whether a process with this id exists (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
