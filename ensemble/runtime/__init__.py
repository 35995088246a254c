"""Layer 1: where and how code runs. ``mpi`` (the only mpi4py importer besides
``datafeed.distribute``: tags, polite waits, topology, abort-on-error), ``executor``
(serial and MPI executors, the worker loop, in-training reports and decisions),
``budget`` (when to stop handing out work), ``scheduler`` (the job's end as the batch
scheduler set it), ``env`` (threads, GPU binding for NVIDIA/AMD/Intel, TensorFlow
settings, versions), ``logs`` (logging set-up), ``data_parallel`` (the fused gradient allreduce
inside a member group). Imports only ``ensemble.config``.
"""
