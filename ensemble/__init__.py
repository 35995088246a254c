"""Ensembles and evolutionary architecture search on MPI.

Layers, each importing only from layers below it (checked by tests/test_layering.py):

    5  run, predict, simulate,      ``python -m ensemble.run`` / ``.predict`` / ``.simulate`` /
       reselect                     ``.reselect``: entry points
    4  orchestrate                  a run = spec source x executor x budget x run directory
    3  sources, train, inference    what to train next; training one member; using a run
    2  results                      run directory, journal, packed store, retention, selection, summary
    1  runtime, task                MPI, executors, budget, env, logging; classification/regression
    0  config                       one schema, one vocabulary

Packages of the same layer do not import each other. ``datafeed`` (data) and ``evolve``
(search, MPI-free) sit beside them and may use ``ensemble.config`` only. See
docs/architecture.md.
"""
