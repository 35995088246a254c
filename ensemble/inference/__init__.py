"""Layer 3: using a finished run. ``load`` reads the chosen ensemble from a run directory,
``inputs`` reads and normalises new data as in training, ``combine`` runs the members and
combines them with the task's formulas (one process or over MPI ranks), ``outputs``
writes the predictions, ``export`` builds the whole ensemble as one stock Keras model.
"""
