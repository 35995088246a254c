"""Layer 2: what a run keeps. The run directory (layout, atomic writes, journal), member
ranking and ensemble selection, the leaderboard and the ensemble summary.

Pure Python + numpy + pandas (no TensorFlow, no MPI); imports ``ensemble.task`` and
``ensemble.config`` only. Storage changes (packed member stores) belong in ``rundir``.
"""
