"""Layer 5: a run = the mode's source and decider x an executor x a budget x a run directory.

``prepare`` checks the job's size, the data and the architectures on rank 0 and makes the
run directory; ``dispatch`` is the master's loop over any executor; ``session`` is the one
master session (real or simulated: the executor and the clock are injected) and the
worker side; ``simulate`` is the simulated executor on a virtual clock; ``check`` is
``--check``.
"""
