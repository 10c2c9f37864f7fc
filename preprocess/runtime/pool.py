"""Work in forked worker processes that ends, whatever the load and whenever a signal arrives.

Every parallel stage of the package runs on this one module: :func:`map_batches` (a
function over batches, results in order, a few batches per worker in flight),
:func:`beside` (one function in a process of its own while this process goes on) and
:func:`servers` (processes that keep a state between requests: BPE's shards of the words).

The executor is the standard library's ``concurrent.futures.ProcessPoolExecutor`` with
forked workers. loky (joblib's, scikit-learn's) was the other candidate: it reuses one
executor across calls and pickles with cloudpickle, which only matter for interactive
functions and for the spawn-like start it defaults to; here the workers must be forked,
so that they share the pages of what this process holds (the aligner's table, BPE's
segmentations) instead of receiving copies, and the functions are module-level ones.
Both executors detect a worker that died (``BrokenProcessPool``: every pending result
fails at once, where ``multiprocessing.Pool`` waited for ever) and have a shutdown that
lets workers finish and exit; the standard library is already a dependency and loky
would add one for nothing that these stages use. loky's one advantage here, a public way to
kill the workers (``shutdown(kill_workers=True)``), ``ProcessPoolExecutor`` gains in Python
3.14 (``kill_workers``); until then :meth:`Pool.stop` reads its list of processes, which
tests/test_runtime.py checks.

What this module adds to the executor is the signal discipline, because the pool's own
way to stop workers is a signal. ``multiprocessing.Pool.terminate`` once hung
``convs2s-prepare`` for ever: a worker that got its SIGTERM between its fork and the reset
of the handler it inherited from this process (:func:`.processes.exit_on_sigterm`) lost the
signal (Python clears a caught signal's flag in a new child, and drops one whose handler
became the default before it ran), and the pool then waited for that worker. Here:

- SIGINT and SIGTERM are blocked in this thread across every fork of a worker, and a
  worker unblocks them only after it set its own dispositions (SIGINT ignored: Ctrl-C
  reaches the whole process group and this process answers it; SIGTERM the kernel's
  default) and asked the kernel for a signal at this process's death (SIGKILL; SIGTERM for
  :func:`beside`'s, which cleans up). A signal sent meanwhile waits in the kernel and takes
  effect then: none is lost.
- A normal end sends each worker the executor's "no more work" and waits for it to exit:
  no one is terminated. A failure, an interruption or a caller that stops early sends
  SIGTERM to every worker (the default action, or the cleanup of :func:`beside`'s
  function), waits at most :data:`STOP_SECONDS`, SIGKILLs what is left, and then joins
  the executor, whose workers are all gone.

A worker's state (the dictionary to look words up in, the aligner's table) is passed to
the pool (``shared``) and from there to each worker as the executor's ``initargs``, which
a fork hands over without pickling: each task function gets it as its first argument.
It is kept, in the worker only, in this module's ``_shared``; no module of the stages
holds state for its workers.
"""
import collections
import contextlib
import functools
import multiprocessing
import os
import signal
import sys
import time
import traceback
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing.connection import wait
from typing import Callable, Iterable, Iterator, List, Optional

from ..errors import PreprocessError
from .processes import die_with_parent, exit_on_sigterm

# Batches in flight per worker: enough that no worker waits for the next one.
IN_FLIGHT_PER_WORKER = 3
# How long stopped workers may take to exit (beside's function removes its work folder)
# before they are killed.
STOP_SECONDS = 10.0
# How often a wait for a server's answer looks whether the server is still there.
POLL_SECONDS = 0.5
# The signals that stop a command, blocked across a worker's fork.
STOPPING = frozenset({signal.SIGINT, signal.SIGTERM})

# In a worker: what the pool was given as ``shared`` (see the module docstring).
_shared = None


@contextlib.contextmanager
def stopping_deferred() -> Iterator[None]:
    """SIGINT and SIGTERM held back by the kernel during the block, and acted on after it:
    across a fork (see the module docstring), and across the import of torch, whose C++
    initialization aborts the process ("terminate called after throwing an instance of
    'pybind11::error_already_set'") when Ctrl-C interrupts it."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOPPING)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _start_worker(die: Optional[Callable[[], None]], shared) -> None:
    """A worker's first act, with SIGINT and SIGTERM still blocked since its fork."""
    global _shared
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if die:
        die()
    _shared = shared
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPPING)


def _with_shared(fn: Callable, *args):
    """``fn(shared, *args)`` in a worker."""
    return fn(_shared, *args)


@contextlib.contextmanager
def _worker_killed() -> Iterator[None]:
    """A worker killed (by the kernel's OOM killer, say), which the executor reports as a
    broken pool to every submit and result since, said in one line, not a traceback."""
    try:
        yield
    except BrokenProcessPool:
        raise PreprocessError("a worker process was killed before it finished (out of memory? "
                              "see `dmesg`): give fewer --workers, or free memory, and run the "
                              "command again") from None


class Pool:
    """Forked workers of a ``ProcessPoolExecutor`` (see the module docstring); made by
    :func:`worker_pool`."""

    def __init__(self, workers: int, shared=None, death_signal: int = signal.SIGKILL):
        self.executor = ProcessPoolExecutor(
            workers, mp_context=multiprocessing.get_context("fork"), initializer=_start_worker,
            initargs=(die_with_parent(death_signal), shared))

    def submit(self, fn: Callable, *args) -> Future:
        """``fn(*args)`` in a worker. The executor forks its workers at the first submit:
        signals are blocked across it."""
        with stopping_deferred(), _worker_killed():
            return self.executor.submit(fn, *args)

    def stop(self) -> None:
        """SIGTERM to every worker, SIGKILL to those still there after STOP_SECONDS, then
        the executor joined (its manager thread reaps them)."""
        processes = list((self.executor._processes or {}).values())  # no public list before 3.14
        self.executor.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            process.terminate()
        alive, deadline = [process.sentinel for process in processes], time.monotonic() + STOP_SECONDS
        while alive and deadline > time.monotonic():
            ended = wait(alive, deadline - time.monotonic())
            alive = [sentinel for sentinel in alive if sentinel not in ended]
        for process in processes:
            if process.sentinel in alive:
                process.kill()
        self.executor.shutdown(wait=True)


@contextlib.contextmanager
def worker_pool(workers: int, shared=None, death_signal: int = signal.SIGKILL) -> Iterator[Pool]:
    """A :class:`Pool` of ``workers`` processes for the block: shut down normally at its
    end, stopped if it fails, is interrupted, or is a generator's that is closed early. The
    workers get ``death_signal`` when this process dies."""
    pool = Pool(workers, shared, death_signal)
    try:
        yield pool
        pool.executor.shutdown(wait=True)
    except BaseException:
        pool.stop()
        raise


def map_batches(fn: Callable, batches: Iterable, workers: int, shared=None) -> Iterator:
    """``fn(batch)`` (``fn(shared, batch)`` where ``shared`` is given) for every batch, in
    order, computed by ``workers`` processes (in this one for ``workers`` <= 1). ``fn``:
    a module-level function, or a ``functools.partial`` of one. The last result is yielded
    once the workers have exited, so a caller that stops after it ends the pool normally."""
    if workers <= 1:
        yield from map(fn if shared is None else functools.partial(fn, shared), batches)
        return
    task = fn if shared is None else functools.partial(_with_shared, fn)
    pending = collections.deque()
    with worker_pool(workers, shared) as pool:
        for batch in batches:
            pending.append(pool.submit(task, batch))
            if len(pending) >= IN_FLIGHT_PER_WORKER * workers:
                yield _result(pending.popleft())
        while len(pending) > 1:
            yield _result(pending.popleft())
        last = [_result(future) for future in pending]
    yield from last


def _result(future: Future):
    with _worker_killed():
        return future.result()


def _run_beside(fn: Callable, args: tuple) -> None:
    """:func:`beside`'s function in its worker: SIGTERM (from :meth:`Pool.stop`, or at this
    process's death) raises SystemExit there, so that its ``with`` blocks clean up as they do
    for Ctrl-C; the worker then exits rather than wait for more work, which a dead parent
    would never send."""
    exit_on_sigterm()
    try:
        fn(*args)
    except SystemExit as exc:
        sys.stderr.flush()
        os._exit(exc.code if isinstance(exc.code, int) else 1)


@contextlib.contextmanager
def beside(name: str, fn: Callable, *args) -> Iterator[None]:
    """Run ``fn(*args)`` in a worker process while the block runs, and wait for it at the
    block's end: its failure is raised here as a :class:`PreprocessError` naming ``name``
    (with the traceback of one that is not a :class:`PreprocessError`, a bug). If the block
    fails or is interrupted, the worker is stopped (its ``with`` blocks clean up) before the
    block's exception goes on; if this process dies, the kernel sends it SIGTERM, with the
    same cleanup."""
    with worker_pool(1, death_signal=signal.SIGTERM) as pool:
        future = pool.submit(_run_beside, fn, args)
        yield
        try:
            future.result()
        except PreprocessError as exc:
            raise PreprocessError(f"{name}: {exc}") from None
        except BrokenProcessPool:
            raise PreprocessError(f"{name}: its process was killed (out of memory?) before it "
                                  "finished") from None
        except Exception as exc:
            traceback.print_exception(exc)
            raise PreprocessError(f"{name}: {type(exc).__name__}: {exc}") from None


class Server:
    """This process's end of a connection to a process of :func:`servers`: ``send`` and
    ``recv`` raise a :class:`PreprocessError` naming the work if the server is gone
    (killed, or out of memory), instead of waiting for it."""

    def __init__(self, connection, future: Future, name: str):
        self.connection, self.future, self.name = connection, future, name

    def _stopped(self) -> PreprocessError:
        return PreprocessError(f"{self.name}: a worker process stopped before answering")

    def send(self, message) -> None:
        try:
            self.connection.send(message)
        except (EOFError, OSError):
            raise self._stopped() from None

    def recv(self):
        try:
            while not self.connection.poll(POLL_SECONDS):
                if self.future.done():
                    raise self._stopped()
            return self.connection.recv()
        except (EOFError, OSError):
            raise self._stopped() from None


def _serve(pipes: list, index: int, fn: Callable) -> None:
    """A server: ``fn(connection)`` on its end of pipe ``index``; the other ends that the
    fork gave it are closed first, so that a server's death is an end of file here."""
    for number, (here, there) in enumerate(pipes):
        here.close()
        if number != index:
            there.close()
    fn(pipes[index][1])


@contextlib.contextmanager
def servers(fn: Callable, count: int, name: str) -> Iterator[List[Server]]:
    """``count`` worker processes, each running ``fn(connection)`` to answer what this
    process sends on its :class:`Server` until it sends None; ``fn`` returns then. A
    server's state is best sent to it, not left to the fork: it then holds its own copy
    of what it uses, not pages it shares with this process and copies as it touches them.
    At the block's end each server is sent None and waited for; they are stopped if the
    block fails."""
    if count < 1:
        yield []
        return
    pipes = [multiprocessing.Pipe() for _ in range(count)]
    try:
        with worker_pool(count, pipes) as pool:
            futures = [pool.submit(_with_shared, _serve, index, fn) for index in range(count)]
            for _, there in pipes:
                there.close()
            ends = [Server(here, future, name) for (here, _), future in zip(pipes, futures)]
            yield ends
            for end in ends:
                end.send(None)
            for future in futures:
                future.result()
    finally:
        for here, there in pipes:
            here.close()
            there.close()
