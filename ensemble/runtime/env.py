"""Process set-up on every rank: thread limits, GPU binding, TensorFlow settings.

Thread limits and the GPU must be chosen before numpy and TensorFlow start their pools
or see the devices, so these run first in every entry point (``ensemble.run``,
``ensemble.predict``). TensorFlow is imported only by ``configure_tensorflow``.
"""

from __future__ import annotations

import os
from pathlib import Path


def set_thread_env(threads: int) -> None:
    """Thread limits must be in the environment before numpy/TensorFlow start their pools."""
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "TF_NUM_INTRAOP_THREADS",
                "TF_NUM_INTEROP_THREADS"):
        os.environ.setdefault(var, str(threads))
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def bind_gpu(local_rank: int) -> None:
    """One GPU per rank on the node, chosen by node-local rank, unless the user set devices."""
    if "CUDA_VISIBLE_DEVICES" in os.environ:
        return
    gpus = Path("/proc/driver/nvidia/gpus")
    n = len(list(gpus.iterdir())) if gpus.is_dir() else 0
    if n:
        os.environ["CUDA_VISIBLE_DEVICES"] = str(local_rank % n)


def configure_tensorflow(threads: int) -> None:
    """One TensorFlow thread pool of ``threads`` per rank, deterministic ops; call once per process."""
    import tensorflow as tf
    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)
    except RuntimeError:
        pass                        # already initialised in this process: keep what is set
    tf.config.experimental.enable_op_determinism()
    tf.get_logger().setLevel("ERROR")          # per-member retracing notices are expected here


#: the distributions whose versions say how a run was made (first installed name wins)
COMPONENTS = {"python": None, "tensorflow": ("tensorflow", "tensorflow-cpu", "tensorflow-macos"),
              "keras": ("keras",), "numpy": ("numpy",), "mpi4py": ("mpi4py",), "mpich": ("mpich",),
              "deap": ("deap",), "pandas": ("pandas",), "scikit-learn": ("scikit-learn",),
              "mpi-ensemble": ("mpi-ensemble",)}


def environment(argv: list[str], mpi_library: str | None = None) -> dict:
    """How this process was started and with what: the command line and the installed
    versions (read from package metadata, so nothing is imported), for the journal's open
    line and the report. ``mpi_library``: MPI's own version string (``runtime.mpi``)."""
    import platform
    import sys
    from importlib.metadata import PackageNotFoundError, version
    versions = {}
    for name, dists in COMPONENTS.items():
        if dists is None:
            versions[name] = platform.python_version()
            continue
        for dist in dists:
            try:
                versions[name] = version(dist)
                break
            except PackageNotFoundError:
                continue
    if mpi_library:
        versions["MPI library"] = mpi_library
    versions["platform"] = platform.platform()
    return {"argv": [sys.executable, *argv], "cwd": os.getcwd(), "versions": versions}
