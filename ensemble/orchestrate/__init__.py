"""Layer 4: a run = a spec source x an executor x a budget x a run directory.

``prepare`` checks the data and the architectures on rank 0 and makes the run directory;
``dispatch`` is the master's loop over any executor; ``session`` wires the master side
(source, executor, journal, budget, final ensemble) and the worker side together.
"""
