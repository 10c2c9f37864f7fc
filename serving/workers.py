"""Processes side by side, each holding a model of its own: the pool that ``convs2s-serve
--workers`` (:class:`~convs2s_serving.translator.ExportedModel`) and the plugin's
``HubWorkers`` share their batches out to."""
import multiprocessing
from concurrent.futures import ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool

WATCH = 0.2  # seconds between looks at the workers while they load
# what the commands say when a worker dies (the out-of-memory killer's usual victim), after "<command>: error: "
WORKER_DIED = "a worker process died (out of memory? each holds a copy of the model): try fewer --workers"


def started_pool(workers: int, initializer, initargs: tuple) -> ProcessPoolExecutor:
    """A pool of ``workers`` spawned processes, each running ``initializer(*initargs)`` (which
    loads its model); returned when every one has. A process that dies first (as the kernel's
    out-of-memory killer would end it) fails the start: BrokenProcessPool is raised here and
    the other workers are ended."""
    spawn = multiprocessing.get_context("spawn")
    others = set(multiprocessing.active_children())
    pool = ProcessPoolExecutor(workers, mp_context=spawn, initializer=_load,
                               initargs=(initializer, initargs, spawn.Barrier(workers)))
    try:
        started = [pool.submit(int) for _ in range(workers)]  # a process each, spawned now
        ours = set(multiprocessing.active_children()) - others  # a dead one is gone from the list already
        # The pool watches the processes it knew of when it last woke, and a submit wakes it
        # before it spawns: a worker that dies before the pool looks again is never seen, and the
        # rest wait at the barrier for ever. So the workers are watched here too.
        while wait(started, timeout=WATCH).not_done:
            if len(ours) < workers or not all(process.is_alive() for process in ours):
                raise BrokenProcessPool("a worker process died while loading its model")
        for future in started:
            future.result()
    except BaseException:
        for process in set(multiprocessing.active_children()) - others:
            process.terminate()  # those still loading, or waiting at the barrier for the dead one
        pool.shutdown(cancel_futures=True)
        raise
    return pool


def _load(initializer, initargs, loaded):
    """A worker's start: its model, then wait until every worker has one, so that each of
    ``started_pool``'s first tasks is taken by a worker of its own."""
    initializer(*initargs)
    loaded.wait()
