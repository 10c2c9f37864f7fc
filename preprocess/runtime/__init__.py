"""How preparation runs unattended for hours on a shared machine (no stage's text rules here):

- :mod:`.pool`       the one parallel runtime: a process pool that ends whatever the load and
                     whenever a signal arrives
- :mod:`.parallel`   line-by-line work on every core, in order, in bounded memory
- :mod:`.atomic`     atomic steps that rebuild when their inputs or options change
- :mod:`.shards`     the finished parts of a step's output that a rerun after a kill reuses
- :mod:`.locking`    one command at a time per output folder
- :mod:`.progress`   a long stage's progress as log lines: rate and time left
- :mod:`.processes`  child processes that stop with the command that started them
- :mod:`.host`       what the machine offers: usable cores, the default worker count, the
                     cache folder, a process tree (standard library only)
"""
