"""Process set-up on every rank: thread limits, GPU binding, TensorFlow settings.

Thread limits and the GPU must be chosen before numpy and TensorFlow start their pools
or see the devices, so these run first in every entry point (``ensemble.run``,
``ensemble.predict``). TensorFlow is imported only by ``configure_tensorflow``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path


def set_thread_env(threads: int) -> None:
    """Thread limits must be in the environment before numpy/TensorFlow start their pools;
    TensorFlow's import banners are filtered from then on (``QuietImport``)."""
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "TF_NUM_INTRAOP_THREADS",
                "TF_NUM_INTEROP_THREADS"):
        os.environ.setdefault(var, str(threads))
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    QuietImport.install()


#: lines TensorFlow's C++ side writes to stderr while it is imported, whatever
#: TF_CPP_MIN_LOG_LEVEL says (its logging is not initialised yet): every rank printed them
IMPORT_BANNERS = ("All log messages before absl::InitializeLog() is called",
                  "oneDNN custom operations are on",
                  "This TensorFlow binary is optimized to use available CPU instructions",
                  "To enable the following instructions:")


class QuietImport:
    """A ``sys.meta_path`` finder that runs the first import of ``names`` (TensorFlow) with
    the process's stderr (file descriptor 2, where C++ writes) through a pipe whose reader
    thread passes on every line but ``banners``, as it comes (so an error of the import
    itself is seen at once). Installed once; removes itself at the first such import."""

    def __init__(self, names: tuple[str, ...] = ("tensorflow",), banners: tuple[str, ...] = IMPORT_BANNERS):
        self.names, self.banners = names, banners

    @classmethod
    def install(cls, **kw) -> None:
        import sys
        if "tensorflow" in sys.modules or any(isinstance(f, cls) for f in sys.meta_path):
            return
        sys.meta_path.insert(0, cls(**kw))

    def find_spec(self, name: str, path=None, target=None):
        import importlib.util
        import sys
        if name not in self.names:
            return None
        sys.meta_path.remove(self)                 # once, and not for the lookup below
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module) -> None:
            with self.filtered():
                run(module)
        spec.loader.exec_module = exec_module      # this module's loader only
        return spec

    def filtered(self):
        import contextlib
        import sys
        import threading

        @contextlib.contextmanager
        def cm():
            try:
                sys.stderr.flush()
                saved = os.dup(2)
            except (OSError, ValueError):          # no stderr to filter (closed): import as it is
                yield
                return
            read, write = os.pipe()
            os.dup2(write, 2)
            os.close(write)

            def pump() -> None:
                with os.fdopen(read, "rb") as pipe:
                    for line in pipe:
                        if not any(b.encode() in line for b in self.banners):
                            try:
                                os.write(saved, line)
                            except OSError:        # stderr closed, or a child kept the pipe past the import
                                return
            thread = threading.Thread(target=pump, name="quiet-import", daemon=True)
            thread.start()
            try:
                yield
            finally:
                sys.stderr.flush()
                os.dup2(saved, 2)                  # the pipe's last writer gone: the reader ends
                thread.join(timeout=5)
                os.close(saved)
        return cm()


#: each vendor's variable that restricts the devices a process sees (its runtime's own list)
DEVICE_VARIABLES = {"nvidia": "CUDA_VISIBLE_DEVICES", "amd": "ROCR_VISIBLE_DEVICES", "intel": "ZE_AFFINITY_MASK"}
#: the same, as a scheduler or a user may have set them; HIP's list (it indexes ROCr's) is
#: narrowed in its own terms when that is the one given
PRESET_VARIABLES = (("CUDA_VISIBLE_DEVICES", "nvidia"), ("ROCR_VISIBLE_DEVICES", "amd"),
                    ("HIP_VISIBLE_DEVICES", "amd"), ("ZE_AFFINITY_MASK", "intel"))
#: Level Zero's choice of what a device is: FLAT (each tile) or COMPOSITE (each card)
FLAT_VARIABLE = "ZE_FLAT_DEVICE_HIERARCHY"
#: the node-local rank as each launcher states it, to cross-check MPI's
LAUNCHER_LOCAL_RANK = (("SLURM_LOCALID", "Slurm srun"), ("PALS_LOCAL_RANKID", "PALS mpiexec (PBS)"),
                       ("OMPI_COMM_WORLD_LOCAL_RANK", "Open MPI"), ("MPI_LOCALRANKID", "MPICH Hydra"),
                       ("JSM_NAMESPACE_LOCAL_RANK", "jsrun (LSF)"), ("FLUX_TASK_LOCAL_ID", "Flux"))


@dataclass(frozen=True)
class Binding:
    """The device this rank uses: ``variable=device`` was set (or found set, ``preset``)."""
    vendor: str
    variable: str
    device: str
    local_rank: int
    preset: bool = False
    note: str | None = None          # something the user should know (shared GPUs, a disagreement)

    def line(self) -> str:
        how = "as the scheduler set it" if self.preset else f"node-local rank {self.local_rank}"
        return f"{self.vendor} GPU {self.variable}={self.device} ({how})" + (f"; {self.note}" if self.note else "")


def count_gpus(root: str | Path = "/") -> tuple[str | None, int]:
    """(vendor, devices) on this node from the drivers' files, without importing anything:
    NVIDIA's /proc/driver/nvidia/gpus entries, AMD's KFD topology nodes with a GPU id,
    Intel's DRM cards with PCI vendor 0x8086 (whole cards; on Aurora-style cards with two
    tiles, ZE_FLAT_DEVICE_HIERARCHY decides what a device is, and a scheduler's mask wins)."""
    root = Path(root)
    nvidia = root / "proc/driver/nvidia/gpus"
    if nvidia.is_dir() and any(nvidia.iterdir()):
        return "nvidia", len(list(nvidia.iterdir()))
    kfd = root / "sys/class/kfd/kfd/topology/nodes"
    if kfd.is_dir():
        ids = [p / "gpu_id" for p in kfd.iterdir() if (p / "gpu_id").is_file()]
        n = sum(1 for p in ids if p.read_text().strip() not in ("", "0"))      # 0: a CPU node
        if n:
            return "amd", n
    drm = root / "sys/class/drm"
    if drm.is_dir():
        cards = [p for p in drm.glob("card[0-9]*") if "-" not in p.name
                 and (p / "device/vendor").is_file() and (p / "device/vendor").read_text().strip() == "0x8086"
                 and (p / "device/class").is_file() and (p / "device/class").read_text().strip().startswith("0x03")]
        if cards:
            return "intel", len(cards)
    return None, 0


def launcher_local_rank(environ) -> tuple[str, int] | None:
    """(launcher, node-local rank) from the first launcher variable that is set."""
    for var, name in LAUNCHER_LOCAL_RANK:
        value = environ.get(var, "")
        if value.strip().isdigit():
            return name, int(value)
    return None


def choose_binding(local_rank: int, environ, gpus: tuple[str | None, int], ranks_per_gpu: int = 1) -> Binding | None:
    """The device for the rank ``local_rank`` of its node (pure: nothing is set).

    - A variable already naming one device (``--gpus-per-task=1``, ``--gpu-bind``, a jsrun
      resource set, a user's choice) is respected as it is; one naming none (``-1``) too.
    - A variable naming several (``--gpus-per-node`` without a per-task binding) is narrowed
      to the rank's own among them.
    - Otherwise the node's devices (``count_gpus``) are shared out: device
      ``local_rank // ranks_per_gpu``, wrapping round with a note when there are more ranks.
    A launcher's own local rank that disagrees with MPI's is noted (MPI's is used).
    """
    index = local_rank // ranks_per_gpu
    note = None
    said = launcher_local_rank(environ)
    if said is not None and said[1] != local_rank:
        note = (f"{said[0]} says node-local rank {said[1]} but MPI's node communicator says {local_rank}; "
                "MPI's is used (is the launcher's rank placement what the job script asked for?)")
    for var, vendor in PRESET_VARIABLES:
        value = environ.get(var)
        if value is None:
            continue
        listed = [d.strip() for d in value.split(",") if d.strip()]
        if len(listed) <= 1 or "-1" in listed:
            return Binding(vendor, var, value, local_rank, preset=True, note=note)
        if index >= len(listed):
            note = _shared(index, len(listed), ranks_per_gpu, note)
        return Binding(vendor, var, listed[index % len(listed)], local_rank, note=note)
    vendor, n = gpus
    if not n:
        return None
    if index >= n:
        note = _shared(index, n, ranks_per_gpu, note)
    return Binding(vendor, DEVICE_VARIABLES[vendor], str(index % n), local_rank, note=note)


def _shared(index: int, n: int, ranks_per_gpu: int, note: str | None) -> str:
    text = (f"this node has more ranks than {n} GPU(s) x `runtime.ranks_per_gpu` = {ranks_per_gpu}: "
            f"ranks share devices round-robin (set ranks_per_gpu, or start fewer ranks per node)")
    return f"{note}; {text}" if note else text


def bind_gpu(local_rank: int, ranks_per_gpu: int = 1, environ=None, root: str | Path = "/") -> Binding | None:
    """Choose this rank's GPU (``choose_binding``) and set its vendor's variable before any
    GPU runtime starts. With several ranks per GPU, TensorFlow allocates memory as it needs
    it (``TF_FORCE_GPU_ALLOW_GROWTH``) instead of taking the whole device at start."""
    environ = os.environ if environ is None else environ
    binding = choose_binding(local_rank, environ, count_gpus(root), ranks_per_gpu)
    if binding is not None:
        environ[binding.variable] = binding.device
        if binding.vendor == "intel" and not binding.preset:
            # the index counts whole cards (``count_gpus``); in Level Zero's FLAT hierarchy (Aurora's
            # default) a mask index names a tile, and 6 ranks would share the first 3 of 6 cards
            if environ.setdefault(FLAT_VARIABLE, "COMPOSITE").upper() == "FLAT":
                binding = replace(binding, note="; ".join(filter(None, (
                    binding.note, f"{FLAT_VARIABLE}=FLAT is set: ZE_AFFINITY_MASK={binding.device} names a tile, "
                    "not the card this index counts; unset it (COMPOSITE: a device is a card), or bind tiles "
                    "in the launcher (the mask it sets is respected)"))))
        if ranks_per_gpu > 1:
            environ.setdefault("TF_FORCE_GPU_ALLOW_GROWTH", "true")
    return binding


def hide_gpus(environ=None) -> None:
    """No GPU for this process (a master that trains nothing on a CPU-only plan): CUDA's
    and HIP's lists emptied, so TensorFlow's CUDA and ROCm builds both see none."""
    environ = os.environ if environ is None else environ
    environ["CUDA_VISIBLE_DEVICES"] = "-1"
    environ["HIP_VISIBLE_DEVICES"] = "-1"


#: the background import ``preload_tensorflow`` started in this process, if any
_PRELOAD: list = []


def preload_tensorflow():
    """Import TensorFlow and Keras in a background thread, started by a worker while rank 0
    reads and prepares the data: the import (5-8 s per process here, minutes on a shared
    file system at scale) then overlaps rank 0's work instead of following it. Call after
    ``bind_gpu`` (the import must see the GPU binding). Configuring the thread pools stays
    with ``configure_tensorflow``, which first waits for this thread: Keras imported from
    two threads at once can fail half-way ("partially initialized module"), so no other
    code of the process may import TensorFlow or Keras before that. A daemon thread: a rank
    leaving early (rank 0 failed to prepare) does not wait for it. Returns the thread."""
    import importlib
    import threading

    def load() -> None:
        try:
            for name in ("tensorflow", "keras"):
                importlib.import_module(name)
        except Exception:        # noqa: BLE001 - the trainer's own import says what is wrong
            pass

    thread = threading.Thread(target=load, name="preload-tensorflow", daemon=True)
    _PRELOAD.append(thread)
    thread.start()
    return thread


#: what ``configure_tensorflow`` set for this process; ``train.member`` compiles with ``jit_compile``
#: and keeps ``traced_models`` compiled models (``train.traced``; none until configured)
TENSORFLOW = {"precision": "float32", "jit_compile": False, "deterministic": True, "traced_models": 0}


def configure_tensorflow(threads: int, precision: str = "float32", jit_compile: bool = False,
                         deterministic: bool = True, traced_models: int = 0) -> None:
    """One TensorFlow thread pool of ``threads`` per rank; call once per process.
    ``precision``: Keras's global dtype policy ("mixed_float16" / "mixed_bfloat16": layers
    compute in half precision and keep float32 weights; the task's output head stays
    float32). ``jit_compile``: members' train steps are compiled with XLA.
    ``deterministic`` (``runtime.deterministic``): op determinism, so a member trained
    twice the same way ends bit for bit the same. ``traced_models`` (``runtime.traced_models``):
    compiled models kept for the next member of the same architecture (``train.traced``)."""
    while _PRELOAD:                              # the background import, if one runs, ends first
        _PRELOAD.pop().join()
    import keras
    import tensorflow as tf
    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)
    except RuntimeError:
        pass                        # already initialised in this process: keep what is set
    if deterministic:
        tf.config.experimental.enable_op_determinism()
    tf.get_logger().setLevel("ERROR")          # per-member retracing notices are expected here
    keras.mixed_precision.set_global_policy(precision)
    TENSORFLOW.update(precision=precision, jit_compile=jit_compile, deterministic=deterministic,
                      traced_models=traced_models)


def process_started() -> float | None:
    """When this process was created (UNIX seconds, to the kernel's clock tick), before the
    interpreter and any import: the start of the "launch to first member" measurement.
    Linux /proc only; None elsewhere."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        ticks = int(fields[19])                       # starttime, field 22 of proc(5)
        boot = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime "))
        return round(boot + ticks / os.sysconf("SC_CLK_TCK"), 3)
    except (OSError, ValueError, IndexError, StopIteration):
        return None


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
