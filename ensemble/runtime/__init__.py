"""Layer 1: where and how code runs. ``mpi`` (the only mpi4py importer besides
``datafeed.distribute``: tags, polite waits, topology, abort-on-error), ``executor``
(serial and MPI executors, the worker loop, in-training reports and decisions),
``budget`` (when to stop handing out work), ``scheduler`` (the job's end as the batch
scheduler set it), ``env`` (threads, GPU binding for NVIDIA/AMD/Intel, TensorFlow
settings, versions), ``logs`` (logging set-up), ``data_parallel`` (the fused gradient allreduce
inside a member group), ``stage`` (the Python environment copied to node-local storage
before a large job starts: a script run by path, imports nothing of the project, and is
the third module that imports mpi4py). Imports only ``ensemble.config``.
"""
