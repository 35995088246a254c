"""The ensemble's prediction with uncertainty, in one process or spread over MPI ranks.

Member i runs on rank i % P; each rank combines its own members with the task's formulas
(``Task.combine``), and the ranks' shares are summed with ``Task.first_moments`` /
``second_moments`` and finished with ``Task.finish``, the same formulas ``ensemble.json``
and the exported Keras model use. ``comm`` is any object with mpi4py's buffer
``Allreduce``/``Reduce``; this module does not import MPI.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ensemble.inference.inputs import read_input
from ensemble.inference.load import EnsembleRun, Member, PredictError, load_run
from ensemble.task import get_task
from ensemble.task.calibration import apply as apply_calibration

BATCH = 512                           # rows per model call, as in training (same float32 results)


def member_output(member: Member, model, x: np.ndarray, task: str) -> tuple[np.ndarray, np.ndarray | None]:
    """One member on normalised ``x``: probabilities (n, C), or its mean (n, k) and variance
    (n, k; None without a variance head) in the targets' units."""
    return get_task(task).predict(model, x, member.y_shift, member.y_scale, member.gaussian, BATCH,
                                  squeeze=False)


def _local_ensemble(run: EnsembleRun, x: np.ndarray, rank: int, size: int,
                    models: dict | None = None) -> tuple[float, dict | None]:
    """This rank's members (i % size == rank) combined among themselves, and their total
    weight. ``models``: loaded Keras models by member id, filled on first use (a notebook's
    ``ensemble.load`` keeps them between calls)."""
    mine = run.members[rank::size]
    if not mine:
        return 0.0, None
    import keras

    from ensemble.runtime.env import configure_tensorflow
    configure_tensorflow(1)
    task = get_task(run.task)
    outs = []
    models = {} if models is None else models
    for m in mine:
        try:
            model = models.get(m.id) or keras.models.load_model(m.model_path, compile=False)
        except Exception as exc:
            raise PredictError(f"member {m.id!r}: cannot load {m.model_path!r}: {exc}") from exc
        models[m.id] = model
        want = task.output_width(run.n_outputs, m.gaussian)
        if model.output_shape[-1] != want:
            raise PredictError(f"member {m.id!r} outputs {model.output_shape[-1]} values per sample, but "
                               f"{want} are expected for this {run.task} ensemble")
        outs.append(member_output(m, model, x, run.task))
    w = np.array([m.weight for m in mine])
    return float(w.sum()), task.combine_outputs(outs, w)


def predict_arrays(run: EnsembleRun, x: np.ndarray, comm=None, models: dict | None = None) -> dict[str, np.ndarray]:
    """The ensemble on normalised ``x``, spread over ``comm``'s ranks (None: this process only).

    Classification: "proba" (n, C), "total", "aleatoric", "epistemic" (n,) in nats.
    Regression: "mean", "var", "std", "aleatoric", "epistemic", each (n,) or (n, k), and
    "intervals" (half-widths of the central intervals of ``metrics.COVERAGE_LEVELS``). Both recalibrated as the
    run's ``ensemble.json`` says.
    Collective over ``comm``; the result is complete on rank 0 only (empty elsewhere).
    """
    rank, size = (comm.Get_rank(), comm.Get_size()) if comm is not None else (0, 1)
    n, k = len(x), run.n_outputs
    task = get_task(run.task)
    error, weight, part = None, 0.0, None
    try:
        weight, part = _local_ensemble(run, x, rank, size, models)
    except Exception as exc:
        error = str(exc) if isinstance(exc, PredictError) else f"{type(exc).__name__}: {exc}"
        if size == 1:
            raise PredictError(error) from exc
        error = f"rank {rank}: {error}"
    if size == 1:                                  # the weights sum to one: nothing to combine
        return _calibrated(_squeeze(dict(part), run), run)
    from ensemble.runtime.mpi import polite_barrier
    polite_barrier(comm)                           # idle ranks sleep while the others predict
    errors = [e for e in comm.allgather(error) if e]
    if errors:
        raise PredictError("; ".join(errors))
    first = np.empty((n, task.first_moments(0.0, None, 1, k).shape[1]))
    comm.Allreduce(task.first_moments(weight, part, n, k), first)   # numpy buffers, summed; no pickling
    local_second = task.second_moments(weight, part, first, k)
    second = np.empty_like(local_second) if rank == 0 else None
    if local_second.size:
        comm.Reduce(local_second, second, root=0)
    return _calibrated(_squeeze(task.finish(first, second, k), run), run) if rank == 0 else {}


def _calibrated(result: dict, run: EnsembleRun) -> dict:
    """The run's recalibration applied (``ensemble.task.calibration``): a regression result
    gains "intervals" ({"50", "80", "90", "95"} -> half-widths), its spread rescaled; a
    classification result's probabilities are temperature-scaled if the run chose it."""
    return apply_calibration(run.task, result, run.calibration)


def _squeeze(result: dict, run: EnsembleRun) -> dict[str, np.ndarray]:
    if run.task == "regression":
        n, k = len(result["mean"]), run.n_outputs
        result = {key: np.asarray(v).reshape((n,) if k == 1 else (n, k)) for key, v in result.items()}
    return result


def predict_file(run_dir: str | Path, source: str, **overrides) -> tuple[dict, np.ndarray | None]:
    """In one process: the ensemble's prediction on ``source`` and its encoded targets (or None)."""
    run = load_run(run_dir)
    x, y = read_input(run, source, **overrides)
    return predict_arrays(run, x), y


def score(run: EnsembleRun, result: dict, y: np.ndarray) -> dict[str, float]:
    """The metrics ``ensemble.json`` reports, on these predictions."""
    return get_task(run.task).ensemble_metrics(y, result, run.gaussian)
