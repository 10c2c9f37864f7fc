"""Processes side by side, each holding a model of its own: the pool that ``convs2s-serve
--workers`` (:class:`~convs2s_serving.translator.ExportedModel`) and the plugin's
``HubWorkers`` share their batches out to."""
import multiprocessing
from concurrent.futures import ProcessPoolExecutor


def started_pool(workers: int, initializer, initargs: tuple) -> ProcessPoolExecutor:
    """A pool of ``workers`` spawned processes, each running ``initializer(*initargs, loaded)``,
    where ``loaded`` is a barrier the initializer waits at once its model is loaded; returned
    when every process has started and loaded. A process that fails breaks the pool, which
    ends the others, and the failure is raised here."""
    spawn = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(workers, mp_context=spawn, initializer=initializer,
                               initargs=(*initargs, spawn.Barrier(workers)))
    try:
        for started in [pool.submit(int) for _ in range(workers)]:  # a process each, started now
            started.result()
    except BaseException:
        pool.shutdown(cancel_futures=True)
        raise
    return pool
