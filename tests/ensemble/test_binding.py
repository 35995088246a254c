"""GPU binding with faked device trees and launcher environments: NVIDIA, AMD and Intel
devices, a scheduler's own binding respected, several ranks per GPU, and every launcher's
local-rank variable cross-checked against MPI's."""

from __future__ import annotations

import pytest

from ensemble.runtime.env import LAUNCHER_LOCAL_RANK, bind_gpu, choose_binding, count_gpus, hide_gpus


def nvidia(root, n):
    for i in range(n):
        (root / "proc/driver/nvidia/gpus" / f"0000:{i:02x}:00.0").mkdir(parents=True)
    return root


def amd(root, n):
    nodes = root / "sys/class/kfd/kfd/topology/nodes"
    for i in range(n + 1):                              # node 0 is the CPU (gpu_id 0)
        (nodes / str(i)).mkdir(parents=True)
        (nodes / str(i) / "gpu_id").write_text("0\n" if i == 0 else f"{1000 + i}\n")
    return root


def intel(root, n):
    drm = root / "sys/class/drm"
    for i in range(n):
        dev = drm / f"card{i}" / "device"
        dev.mkdir(parents=True)
        (dev / "vendor").write_text("0x8086\n")
        (dev / "class").write_text("0x038000\n")
        (drm / f"card{i}-DP-1").mkdir()                 # a connector, not a card
    aspeed = drm / f"card{n}" / "device"                # the board's display chip
    aspeed.mkdir(parents=True)
    (aspeed / "vendor").write_text("0x1a03\n")
    (aspeed / "class").write_text("0x030000\n")
    return root


@pytest.mark.parametrize("make, vendor, variable", [(nvidia, "nvidia", "CUDA_VISIBLE_DEVICES"),
                                                    (amd, "amd", "ROCR_VISIBLE_DEVICES"),
                                                    (intel, "intel", "ZE_AFFINITY_MASK")])
def test_each_vendor_one_gpu_per_rank(tmp_path, make, vendor, variable):
    root = make(tmp_path, 4)
    assert count_gpus(root) == (vendor, 4)
    for local in range(4):
        env = {}
        b = bind_gpu(local, 1, env, root)
        # a card, not a tile: Level Zero's FLAT default made index 1 the second tile of card 0
        flat = {"ZE_FLAT_DEVICE_HIERARCHY": "COMPOSITE"} if vendor == "intel" else {}
        assert env == {variable: str(local), **flat} and b.vendor == vendor and not b.preset and b.note is None


def test_an_intel_flat_hierarchy_set_by_the_site_is_noted(tmp_path):
    env = {"ZE_FLAT_DEVICE_HIERARCHY": "FLAT"}
    b = bind_gpu(3, 1, env, intel(tmp_path, 6))
    assert env["ZE_AFFINITY_MASK"] == "3" and "names a tile" in b.note


def test_no_gpu_binds_nothing(tmp_path):
    env = {}
    assert count_gpus(tmp_path) == (None, 0) and bind_gpu(2, 1, env, tmp_path) is None and env == {}


def test_several_ranks_per_gpu_share_and_grow_memory(tmp_path):
    root = nvidia(tmp_path, 2)
    devices = []
    for local in range(4):
        env = {}
        bind_gpu(local, 2, env, root)
        devices.append(env["CUDA_VISIBLE_DEVICES"])
        assert env["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"
    assert devices == ["0", "0", "1", "1"]


def test_more_ranks_than_gpus_wraps_with_a_note(tmp_path):
    b = choose_binding(5, {}, ("nvidia", 4))
    assert b.device == "1" and "more ranks than 4 GPU(s)" in b.note


@pytest.mark.parametrize("variable, value", [("CUDA_VISIBLE_DEVICES", "3"),       # srun --gpus-per-task=1
                                             ("ROCR_VISIBLE_DEVICES", "5"),       # Frontier's --gpu-bind=closest
                                             ("ZE_AFFINITY_MASK", "2.1"),          # Aurora: a tile
                                             ("CUDA_VISIBLE_DEVICES", "-1")])      # no GPU, on purpose
def test_a_binding_the_scheduler_set_is_respected(tmp_path, variable, value):
    env = {variable: value}
    b = bind_gpu(1, 1, env, nvidia(tmp_path, 4))
    assert env == {variable: value} and b.preset and b.device == value


@pytest.mark.parametrize("variable", ["CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES",
                                      "ZE_AFFINITY_MASK"])
def test_a_node_wide_list_is_narrowed_to_the_ranks_own(variable):
    env = {variable: "4,5,6,7"}                          # --gpus-per-node=4 on the node's second half
    b = choose_binding(2, env, (None, 0))
    assert b.variable == variable and b.device == "6" and not b.preset


@pytest.mark.parametrize("variable, launcher", LAUNCHER_LOCAL_RANK)
def test_every_launchers_local_rank_is_cross_checked(variable, launcher):
    assert choose_binding(1, {variable: "1"}, ("nvidia", 4)).note is None
    note = choose_binding(1, {variable: "3"}, ("nvidia", 4)).note
    assert launcher in note and "says node-local rank 3" in note and "MPI's is used" in note


def test_hide_gpus_for_cuda_and_rocm_builds():
    env = {}
    hide_gpus(env)
    assert env == {"CUDA_VISIBLE_DEVICES": "-1", "HIP_VISIBLE_DEVICES": "-1"}


@pytest.mark.slow
def test_tensorflow_preloaded_in_the_background_still_takes_the_thread_settings():
    """A worker imports TensorFlow in a thread while rank 0 prepares the data; the import must
    not start TensorFlow's runtime, or ``configure_tensorflow`` could no longer set the one
    thread per rank (it would keep TensorFlow's defaults, silently); and
    ``configure_tensorflow`` called while the import runs waits for it (Keras imported from
    two threads at once fails half-way: "partially initialized module"). A fresh process:
    the thread pools are process-wide."""
    import subprocess
    import sys
    code = ("import sys\n"
            "from ensemble.runtime.env import configure_tensorflow, preload_tensorflow\n"
            "thread = preload_tensorflow()\n"
            "configure_tensorflow(1)\n"
            "assert not thread.is_alive()\n"
            "import tensorflow as tf\n"
            "print(tf.config.threading.get_intra_op_parallelism_threads(),"
            " tf.config.threading.get_inter_op_parallelism_threads())\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["1", "1"], proc.stdout
