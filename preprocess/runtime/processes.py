"""Child processes that stop with the command that started them.

A long external program (the word aligner) must not go on running, writing into a folder
that is being removed, once the command that started it is gone, nor must anything it
started itself (``eflomal-align`` runs an ``eflomal`` binary):

- SIGINT (Ctrl-C) and SIGTERM of the parent: :func:`exit_on_sigterm` turns SIGTERM into
  ``SystemExit`` as Python turns SIGINT into ``KeyboardInterrupt``, and :func:`run_child`
  kills the child's process group before the exception goes on, so the ``with`` blocks
  above it can remove the child's files.
- SIGKILL of the parent, which nothing can catch: on Linux the kernel signals a child whose
  parent dies if the child asked for it (``prctl(PR_SET_PDEATHSIG)``), but that request is
  not inherited by the processes the child starts. So :func:`run_child` starts a guardian,
  ``python -m convs2s_preprocess.runtime.processes PARENT_PID -- COMMAND...``, that asks for SIGTERM
  at its parent's death, becomes the "subreaper" of what it starts
  (``PR_SET_CHILD_SUBREAPER``: orphaned descendants become its children, not init's), and
  runs the command; on SIGTERM, and after the command ends, it SIGKILLs every descendant
  it has, whatever process group or session they moved to. The command itself also gets
  SIGKILL at the guardian's death.

The package's own worker processes (:mod:`.pool`) ask for SIGKILL at the command's death
with :func:`die_with_parent`.
"""
import atexit
import ctypes
import functools
import os
import signal
import subprocess
import sys
from typing import Callable, Optional, Sequence

from .host import descendants

PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
PR_SET_CHILD_SUBREAPER = 36
GUARDIAN_MODULE = "convs2s_preprocess.runtime.processes"


def exit_on_sigterm() -> None:
    """Make SIGTERM raise ``SystemExit(143)``, so that cleanup runs as it does for Ctrl-C. And
    once the command has ended, hold SIGTERM and SIGINT back: while Python shuts down it puts
    back their default actions, and a signal then would kill a command whose work is done
    (its exit status -15, not its own)."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    atexit.register(signal.pthread_sigmask, signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})


@functools.lru_cache(maxsize=None)
def _prctl():
    return ctypes.CDLL(None, use_errno=True).prctl


def _die_with(parent: int, sig: int) -> None:
    _prctl()(PR_SET_PDEATHSIG, sig)
    if os.getppid() != parent:  # the parent died before the request took effect
        os.kill(os.getpid(), sig)


def die_with_parent(sig: int = signal.SIGKILL) -> Optional[Callable[[], None]]:
    """A ``preexec_fn`` or pool ``initializer`` (picklable) that has the kernel send ``sig``
    to the child when this process dies (Linux; None elsewhere)."""
    if not sys.platform.startswith("linux"):
        return None
    _prctl()  # looked up before a fork: a child of a threaded process must not load libraries
    return functools.partial(_die_with, os.getpid(), sig)


def run_child(cmd: Sequence[str], stdout, stderr, cwd: str, env: dict) -> int:
    """Run ``cmd`` to its end and return its exit status; neither it nor anything it
    starts outlives this process (on Linux; elsewhere its process group is killed when
    this process is interrupted)."""
    if sys.platform.startswith("linux"):
        cmd = [sys.executable, "-m", GUARDIAN_MODULE, str(os.getpid()), "--", *cmd]
    proc = subprocess.Popen(cmd, stdout=stdout, stderr=stderr, cwd=cwd, env=env,
                            start_new_session=True,
                            preexec_fn=die_with_parent(signal.SIGTERM))
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


def kill_descendants() -> None:
    """SIGKILL every descendant of this process, again until none is left (one may fork
    while the others are being killed)."""
    for _ in range(100):
        pids = descendants(os.getpid())
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:  # reap the children among them
                pass
        except ChildProcessError:
            pass


def guard(parent: int, cmd: Sequence[str]) -> int:
    """The guardian's work (see the module docstring); returns the command's exit status."""
    def stop(signum, frame):
        kill_descendants()
        os._exit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, stop)
    if os.getppid() != parent:  # the parent died before the handler was in place
        return 128 + signal.SIGTERM
    _prctl()(PR_SET_CHILD_SUBREAPER, 1)
    try:
        proc = subprocess.Popen(cmd, preexec_fn=die_with_parent())
    except OSError as exc:
        print(f"error: cannot run {cmd[0]}: {exc.strerror}", file=sys.stderr)
        return 127
    status = proc.wait()
    kill_descendants()
    return status if status >= 0 else 128 - status


if __name__ == "__main__":
    sys.exit(guard(int(sys.argv[1]), sys.argv[3:]))
