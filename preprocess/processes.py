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
  ``python -m convs2s_preprocess.processes PARENT_PID -- COMMAND...``, that asks for SIGTERM
  at its parent's death, becomes the "subreaper" of what it starts
  (``PR_SET_CHILD_SUBREAPER``: orphaned descendants become its children, not init's), and
  runs the command; on SIGTERM, and after the command ends, it SIGKILLs every descendant
  it has, whatever process group or session they moved to. The command itself also gets
  SIGKILL at the guardian's death.

The worker processes of a pool (:func:`worker_pool`) leave Ctrl-C to the command, die with
it, and keep the kernel's SIGTERM, so that neither an interrupted nor a killed command leaves
workers running or printing tracebacks.

Workers that keep a state between requests (the words of a shard of the vocabulary, while
BPE's merges are learned) are forked processes with a connection each (:func:`servers`):
they leave Ctrl-C to the command and die with it likewise.

A step of this package can also run beside the others (:func:`beside`): in a forked
process that gets SIGTERM at the parent's death, is stopped with SIGTERM when the parent's
work fails or is interrupted, and hands back its error, as one line, when it fails.
"""
import contextlib
import ctypes
import functools
import multiprocessing
import multiprocessing.pool
import os
import signal
import subprocess
import sys
import traceback
from typing import Callable, Iterator, Optional, Sequence

from .errors import PreprocessError

PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
PR_SET_CHILD_SUBREAPER = 36
GUARDIAN_MODULE = "convs2s_preprocess.processes"


def exit_on_sigterm() -> None:
    """Make SIGTERM raise ``SystemExit(143)``, so that cleanup runs as it does for Ctrl-C."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


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


def _start_pool_worker(die: Optional[Callable[[], None]]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # The pool stops its workers with SIGTERM: the kernel's default action, not the handler
    # of exit_on_sigterm inherited from this process (a Python handler runs only when the
    # worker's wait for its next batch is interrupted, and a signal that arrives just before
    # that wait is only noticed after it: Pool.terminate then waits for ever).
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if die:
        die()


def worker_pool(workers: int, context=multiprocessing) -> multiprocessing.pool.Pool:
    """A process pool whose workers leave Ctrl-C to this process (it reaches the whole
    process group; this process answers it and the pool's end stops them) and die with it
    (Linux): a killed or interrupted command leaves no worker finishing its batch for
    nobody, nor their tracebacks."""
    return context.Pool(workers, initializer=_start_pool_worker, initargs=(die_with_parent(),))


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


def _run_beside(conn, fn: Callable, args: tuple, preexec: Optional[Callable[[], None]]) -> None:
    """The forked child of :func:`beside`: ``fn(*args)``, then None or its error's text
    sent to the parent."""
    if preexec:
        preexec()
    exit_on_sigterm()
    try:
        fn(*args)
    except PreprocessError as exc:
        conn.send(str(exc))
    except KeyboardInterrupt:  # Ctrl-C reaches the parent too, which says so
        sys.exit(128 + signal.SIGINT)
    except SystemExit:  # stopped by the parent, or by SIGTERM
        raise
    except Exception as exc:  # a bug: its traceback, and the parent names the step
        traceback.print_exc()
        conn.send(f"{type(exc).__name__}: {exc}")
    else:
        conn.send(None)


@contextlib.contextmanager
def beside(name: str, fn: Callable, *args) -> Iterator[None]:
    """Run ``fn(*args)`` in a forked process while the block runs, and wait for it at the
    block's end: its :class:`PreprocessError` (or any other failure) is raised here as a
    :class:`PreprocessError` naming ``name``. If the block fails or is interrupted, the
    process is stopped with SIGTERM (its ``with`` blocks clean up, as for Ctrl-C) before
    the block's exception goes on; if this process dies, the kernel sends it SIGTERM."""
    receive, send = multiprocessing.Pipe(duplex=False)
    child = multiprocessing.get_context("fork").Process(
        target=_run_beside, args=(send, fn, args, die_with_parent(signal.SIGTERM)),
        name=name)
    child.start()
    send.close()
    try:
        yield
    except BaseException:
        if child.is_alive():
            child.terminate()
        child.join()
        receive.close()
        raise
    try:
        error = receive.recv()
    except EOFError:  # ended without a word: killed
        child.join()
        error = f"stopped (exit status {child.exitcode})"
    receive.close()
    child.join()
    if error is not None:
        raise PreprocessError(f"{name}: {error}")


def _serve(conn, fn: Callable, die: Optional[Callable[[], None]], parent_ends: list) -> None:
    """A forked process of :func:`servers`: ``fn(conn)`` until the parent closes its end of
    the connection (the copies of the parent's ends that the fork gave this process are
    closed first, or the parent's would not be the last)."""
    for end in parent_ends:
        end.close()
    _start_pool_worker(die)
    try:
        fn(conn)
    except EOFError:  # the parent is done with this server
        pass


@contextlib.contextmanager
def servers(fn: Callable, count: int) -> Iterator[list]:
    """``count`` forked processes, each running ``fn(connection)`` to answer what this
    process sends on its connection until the connection closes (``fn``'s ``recv`` raises
    EOFError); the block gets the connections, for :func:`tell` and :func:`answer`. A
    server's state is best sent to it, not left to the fork: it then holds its own copy of
    what it uses, not pages it shares with this process and copies as it touches them. The
    processes leave Ctrl-C to this process and die with it, like a pool's workers; at the
    block's end the connections are closed and the processes waited for, or stopped if the
    block failed."""
    context, die, connections, processes = multiprocessing.get_context("fork"), die_with_parent(), [], []
    try:
        for _ in range(count):
            here, there = multiprocessing.Pipe()
            connections.append(here)
            processes.append(context.Process(target=_serve, args=(there, fn, die, connections), daemon=True))
            processes[-1].start()
            there.close()
        yield connections
    except BaseException:
        for process in processes:
            process.terminate()
        raise
    finally:
        for connection in connections:
            connection.close()
        for process in processes:
            process.join()


@contextlib.contextmanager
def _server_stopped(name: str) -> Iterator[None]:
    try:
        yield
    except (EOFError, ConnectionError):
        raise PreprocessError(f"{name}: a worker process stopped before answering") from None


def tell(connection, message, name: str) -> None:
    """Send ``message`` to a server of :func:`servers`; a :class:`PreprocessError` naming
    ``name`` if it stopped (killed, or out of memory: its traceback is on stderr)."""
    with _server_stopped(name):
        connection.send(message)


def answer(connection, name: str):
    """What a server of :func:`servers` sent on ``connection``; a :class:`PreprocessError`
    naming ``name`` if it stopped instead."""
    with _server_stopped(name):
        return connection.recv()


def process_exists(pid: int) -> bool:
    """Whether a process with this id exists (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _parents() -> dict:
    """{pid: parent pid} of the live (not zombie) processes, read from /proc."""
    parents = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # pid (comm) state ppid ...; comm may hold spaces and parentheses
        state, ppid = stat[stat.rindex(b")") + 2:].split()[:2]
        if state != b"Z":
            parents[int(entry)] = int(ppid)
    return parents


def descendants(pid: int) -> list:
    """The live descendants of process ``pid``."""
    children = {}
    for child, parent in _parents().items():
        children.setdefault(parent, []).append(child)
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


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
