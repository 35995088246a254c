"""Layer 1: the task (classification or regression) and the metrics that score it.

``tasks`` holds the task objects (output head, loss, target scaling, output decoding,
metrics, and the ensemble combination formulas); ``metrics`` the numpy scores and
uncertainty splits. Imports only ``ensemble.config``; Keras only inside the head/loss.
"""

from ensemble.task.tasks import VAR_FLOOR, Classification, Regression, Task, gaussian_nll, get_task

__all__ = ["VAR_FLOOR", "Classification", "Regression", "Task", "gaussian_nll", "get_task"]
