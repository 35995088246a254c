"""``python -m ensemble.run CONFIG --check``: the dry check before a job is submitted.

Mostly in-process through ``check_main`` (TensorFlow imported once per test process), once
through ``python -m ensemble.run`` in a subprocess. No MPI."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ensemble.config import ConfigError, Problems, resolve_config
from ensemble.config.vocabulary import OPTIMIZER_SLOTS, OPTIMIZERS
from ensemble.orchestrate.check import EXIT_PROBLEMS, PREDICT_BATCH, check_main, member_memory
from tests.conftest import importable

ROOT = Path(__file__).resolve().parents[2]

#: three different mistakes: an unknown key, an impossible value, a data file that is not there
THREE_MISTAKES = """
    [data]
    source = "no_such_file.npz"
    [train]
    epocs = 3
    [[architectures]]
    learning_rate = -0.1
    layers = [{type = "Dense", units = 8}]
"""


@pytest.fixture(autouse=True)
def own_env(monkeypatch):
    """check_main fills in thread limits and hides GPUs with setdefault: keep that to the test."""
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "TF_NUM_INTRAOP_THREADS",
                "TF_NUM_INTEROP_THREADS", "TF_CPP_MIN_LOG_LEVEL", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.setenv(var, os.environ.get(var, "-1" if var == "CUDA_VISIBLE_DEVICES" else "1"))


def write(tmp_path: Path, text: str, name: str = "c.toml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_a_valid_config_passes_and_reports_data_and_parameters(capsys):
    assert check_main(str(ROOT / "configs" / "digits.toml")) == 0
    out = capsys.readouterr().out
    assert "features [1797, 64]" in out and "10 classes" in out and "0: 178" in out
    assert "splits: train 1167, validation 270, test 360" in out
    assert "mlp: 4 member(s), 11,386 parameters" in out and "cnn: 4 member(s), 9,930 parameters" in out
    assert "per member rank" in out and "per node: the data once" in out
    assert "No problems found" in out


def test_an_evolve_config_builds_a_sample_of_the_space(tmp_path, capsys):
    cfg = write(tmp_path, """
        mode = "evolve"
        seed = 3
        [data]
        reshape = [8, 8, 1]
        [evolve]
        evaluations = 4
        [search]
        max_depth = 3
        filters = [8, 16]
        units = [16, 32]
        max_params = 20000
    """)
    assert check_main(str(cfg)) == 0
    out = capsys.readouterr().out
    assert "one sample as the networks see it: [8, 8, 1]" in out
    assert "a seeded sample of 5 genomes" in out and "  genome 5: in 8x8x1: " in out
    assert "  parameters: " in out
    assert "No problems found" in out
    assert "are read as" not in out


def test_an_evolve_config_on_two_axes_says_they_are_steps_and_channels(tmp_path, capsys):
    """Samples of shape (8, 8) are searched with 1-D convolutions (8 steps, 8 channels): said, with
    the reshape that makes them images."""
    cfg = write(tmp_path, """
        mode = "evolve"
        [data]
        reshape = [8, 8]
        [evolve]
        evaluations = 2
    """)
    assert check_main(str(cfg)) == 0
    out = capsys.readouterr().out
    assert ("samples of shape [8, 8] are read as 8 steps of 8 channel(s) (1-D convolutions); for images set "
            "`data.reshape = [8, 8, 1]`") in out
    assert "a genome at that cap needs" in out


def test_three_mistakes_are_all_listed(tmp_path, capsys):
    assert check_main(str(write(tmp_path, THREE_MISTAKES))) == EXIT_PROBLEMS
    out = capsys.readouterr().out
    problems = out.split("3 problem(s) found:")[1]
    assert "1. unknown setting `train.epocs` (did you mean 'epochs'?)" in problems
    assert "2. `architectures[0].learning_rate` must be > 0, but got -0.1" in problems
    assert f"3. `data.source` file {str(tmp_path / 'no_such_file.npz')!r} does not exist" in problems
    assert "Architectures: not built without the data" in out
    assert "listed at the end with any the data and networks add; those settings show their defaults here" \
        in out                                                                          # the header's values


def test_build_and_data_problems_are_gathered_too(tmp_path, capsys):
    cfg = write(tmp_path, f"""
        [ensemble]
        metric = "mse"
        [[architectures]]
        name = "flatconv"
        layers = [{{type = "Conv2D", filters = 4, kernel_size = 3}}]
        [[architectures]]
        name = "logits"
        model = "tests.mpi.user_models:logits_mlp"
        model_dir = "{ROOT}"
        [[architectures]]
        name = "fine"
        layers = [{{type = "Dense", units = 8}}, {{type = "Dens", units = 4}}]
        [[architectures]]
        name = "good"
        model = "tests.mpi.user_models:small_mlp"
        model_dir = "{ROOT}"
        params = {{units = 8}}
    """)
    assert check_main(str(cfg)) == EXIT_PROBLEMS
    out = capsys.readouterr().out
    problems = out.split("4 problem(s) found:")[1]
    assert "`architectures[2].layers[1].type`" in problems and "did you mean 'Dense'" in problems
    assert "`ensemble.metric` 'mse' is a regression metric, but the labels make this task" in problems
    assert "`architectures[0].layers[0]` (Conv2D) needs 3 axes per sample" in problems
    assert "`architectures[1]` (logits): `model` 'tests.mpi.user_models:logits_mlp' must output class" in problems
    assert "good: 1 member(s), 610 parameters" in out


def test_the_command_line_checks_without_mpi(tmp_path):
    """``python -m ensemble.run CFG --check``, run as ``-m`` does, saying at exit whether MPI was loaded."""
    cfg = write(tmp_path, THREE_MISTAKES)
    env = importable()
    as_dash_m = ("import atexit, runpy, sys; "
                 "atexit.register(lambda: print('mpi4py loaded:', 'mpi4py' in sys.modules)); "
                 f"sys.argv = ['ensemble.run', {str(cfg)!r}, '--check']; runpy.run_module('ensemble.run', "
                 "run_name='__main__', alter_sys=True)")
    done = subprocess.run([sys.executable, "-c", as_dash_m], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    for text in ("`train.epocs`", "`architectures[0].learning_rate`", "no_such_file.npz' does not exist"):
        assert text in done.stdout
    assert "mpi4py loaded: False" in done.stdout


def test_a_missing_or_broken_file_is_one_problem(tmp_path, capsys):
    assert check_main(str(tmp_path / "nope.toml")) == EXIT_PROBLEMS
    assert check_main(str(write(tmp_path, "name = \n"))) == EXIT_PROBLEMS
    out = capsys.readouterr().out
    assert "does not exist" in out and "is not valid TOML" in out


def test_the_run_raises_every_problem_at_once_one_per_line():
    raw = {"train": {"epocs": 3, "learning_rate": -1}, "mode": "evolv",
           "architectures": [{"layers": [{"type": "Dens", "units": 3}]}]}
    with pytest.raises(ConfigError) as info:
        resolve_config(raw)
    assert len(info.value.problems) == 4
    assert str(info.value).splitlines() == info.value.problems
    assert [p.split("`")[1] for p in info.value.problems] == [
        "mode", "train.epocs", "train.learning_rate", "architectures[0].layers[0].type"]


def test_gathered_problems_leave_defaults_and_skip_what_depends_on_them():
    found = Problems()
    cfg = resolve_config({"mode": "evolv", "data": {"val_fraction": 2.0, "test_fraction": 0.85},
                          "train": {"epochs": 0}, "evolve": {"strategy": "nsga", "mu": 3},
                          "architectures": [{"layers": [{"type": "Dens", "units": 3}]}]}, problems=found)
    assert cfg.train.epochs == 30 and cfg.mode == "ensemble" and cfg.evolve.strategy == "regularized"
    assert len(found) == 5, found.messages      # no "leave 10% for training", no "needs exactly one of"
    assert not found.ok("architectures[0].layers") and found.ok("architectures[0].model", "train.batch_size")
    assert not found.ok("data.val_fraction") and not found.ok("evolve.strategy")


def test_optimizer_slots_are_what_keras_keeps():
    import keras
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    assert set(OPTIMIZER_SLOTS) == set(OPTIMIZERS)
    for name, cls in OPTIMIZERS.items():
        optimizer = getattr(keras.optimizers, cls)(learning_rate=0.1)
        optimizer.build(model.trainable_variables)
        per_weight = [v for v in optimizer.variables if tuple(v.shape) in {(3, 2), (2,)}]
        assert len(per_weight) == 2 * OPTIMIZER_SLOTS[name], name


def test_memory_is_the_documented_formula():
    size = {"params": 1000, "trainable": 900, "activations": 200, "batch_size": 64, "optimizer": "adam"}
    mem = member_memory(size, group_size=1)
    assert mem["state"] == 4 * (1000 + 900 * 3)
    assert mem["activations"] == 4 * 200 * max(2 * 64, PREDICT_BATCH)
    big = member_memory({**size, "batch_size": 1024, "optimizer": "sgd"}, group_size=2)
    assert big["state"] == 4 * (1000 + 900) and big["activations"] == 4 * 200 * 2 * math.ceil(1024 / 2)
    assert member_memory({**size, "activations": None}, 1)["total"] == mem["state"]
    half = member_memory(size, 1, "mixed_bfloat16")          # it said float32 sizes under mixed precision
    assert half["state"] == mem["state"] and half["activations"] == mem["activations"] // 2


def test_the_exit_status_is_the_runs_config_error():
    from ensemble import run
    assert EXIT_PROBLEMS == run.EXIT_CONFIG


def test_tables_of_another_mode_are_noted_naming_the_mode_that_reads_them(tmp_path):
    """A config with [evolve] and [search] but no `mode = "evolve"`: check passed it silently and
    the run ignored the search; now each is a note (not a problem: the config is valid)."""
    from ensemble.modes import unread_tables
    path = tmp_path / "c.toml"
    path.write_text(textwrap.dedent("""
        [data]
        source = "iris"
        [[architectures]]
        layers = [{type = "Dense", units = 8}]
        [evolve]
        evaluations = 10
        [search]
        max_depth = 2
    """))
    cfg = resolve_config(__import__("tomllib").loads(path.read_text()))
    notes = unread_tables(cfg, str(path))
    assert len(notes) == 2 and all('`mode = "evolve"`?' in n for n in notes)
    assert unread_tables(cfg.replace(mode="evolve"), str(path)) == [
        "[[architectures]] is set, but mode 'evolve' does not build them (it searches its own)"]


def test_an_online_config_whose_source_the_run_will_write_is_no_problem(tmp_path, capsys):
    """Mode "online" writes `data.source` from the simulation's first samples: the example's
    config, checked before any run, was "1 problem: does not exist" (exit 2); a missing file
    under another mode stays a problem, and the simulator says why it needs the file."""
    from ensemble import simulate
    text = (ROOT / "examples" / "heat_online.toml").read_text()
    config = write(tmp_path, text.replace('source = "', f'source = "{tmp_path}/not-yet/', 1), "online.toml")
    assert check_main(str(config)) == 0
    out = capsys.readouterr().out
    assert "does not exist yet: the run writes it" in out and "No problems found" in out
    assert f"Submit it: mpirun -n S python sim.py : -n E python -m ensemble.run {config}" in out
    assert simulate.main([str(config), "--workers", "8"]) == 3
    assert "does not exist yet" in capsys.readouterr().err
    other = write(tmp_path, 'mode = "ensemble"\n[data]\nsource = "missing.npz"\n', "plain.toml")
    assert check_main(str(other)) == EXIT_PROBLEMS


def test_search_problems_are_listed_with_the_others_before_the_data(tmp_path, capsys):
    """A `[search]` value was checked only once every other setting and the data were right, and
    one at a time."""
    cfg = write(tmp_path, """
mode = "evolve"
[data]
source = "no_such_file.npz"
[train]
epochs = 0
[evolve]
evaluations = 4
[search]
units = [64, 16]
dropout = [0.0, 1.2]
""")
    assert check_main(str(cfg)) == EXIT_PROBLEMS
    problems = capsys.readouterr().out.split("problem(s) found:")[1]
    for text in ("`train.epochs` must be", "`search.units` must be [min, max] with min <= max",
                 "`search.dropout` must be [min, max]", "does not exist"):
        assert text in problems


def test_check_with_resume_names_every_setting_the_run_was_not_made_with(tmp_path, capsys):
    """`ensemble run X.toml --resume --check` said "No problems found" for a config whose resume
    was then refused, one table a try."""
    from ensemble.config import dump_toml, load_config
    from ensemble.orchestrate.check import main
    cfg = write(tmp_path, f"""
name = "r"
output_dir = "{tmp_path / 'runs'}"
[data]
source = "iris"
[train]
epochs = 2
[[architectures]]
members = 1
layers = [{{type = "Dense", units = 4}}]
""")
    run = tmp_path / "runs" / "r"
    assert main([str(cfg), "--resume"]) == EXIT_PROBLEMS                     # nothing to resume yet
    assert "holds no journal.jsonl" in capsys.readouterr().out
    run.mkdir(parents=True)
    (run / "config.toml").write_text(dump_toml(load_config(cfg)))
    (run / "journal.jsonl").write_text("")
    assert main([str(cfg), "--resume"]) == 0
    assert f"Resume: {str(run)!r}, made with these settings" in capsys.readouterr().out
    # the ranks line counts what the resume has left, not a fresh run's members
    cfg.write_text(cfg.read_text().replace("members = 1", "members = 3"))
    (run / "config.toml").write_text(dump_toml(load_config(cfg)))
    (run / "journal.jsonl").write_text(json.dumps({"id": "a-000", "status": "ok", "val": {"accuracy": 0.9}}) + "\n")
    assert main([str(cfg), "--resume"]) == 0
    out = capsys.readouterr().out
    assert "the run to resume has 1 of 3 members finished: -n 3 trains the 2 left at once." in out
    assert "trains all 3 members" not in out
    cfg.write_text(cfg.read_text().replace("members = 3", "members = 1"))
    (run / "config.toml").write_text(dump_toml(load_config(cfg)))
    (run / "journal.jsonl").write_text("")
    cfg.write_text(cfg.read_text().replace("epochs = 2", "epochs = 5").replace("units = 4", "units = 8"))
    assert main([str(cfg), "--resume", "--run-dir", str(run)]) == EXIT_PROBLEMS
    out = capsys.readouterr().out
    assert "`train.epochs` 2 in the run, 5 now" in out
    assert "`architectures[0].layers[0].units` 4 in the run, 8 now" in out
    assert f"check again: ensemble check {cfg} --resume --run-dir {run}" in out


def test_check_with_resume_sees_the_labels_changed(tmp_path, capsys):
    """`ensemble check X --resume` said "No problems found" for data whose labels changed since the
    run began (the resume then mixed scores of two datasets)."""
    import numpy as np

    from ensemble.orchestrate.check import main
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(90, 4)), np.arange(90) % 3
    np.savez(tmp_path / "d.npz", x=x, y=y)
    cfg = write(tmp_path, f"""
name = "r"
output_dir = "{tmp_path / 'runs'}"
[data]
source = "d.npz"
[[architectures]]
members = 1
layers = [{{type = "Dense", units = 4}}]
""")
    from datafeed.prepare import prepare_with_rows
    from datafeed.splits import read_data
    from ensemble.config import dump_toml, load_config
    from ensemble.results.rundir import RunDirectory
    loaded = load_config(cfg)
    got = read_data(loaded.data)
    arrays, meta, _ = prepare_with_rows(got.x, got.y, got.info, loaded.data, loaded.seed, got.rows)
    run = RunDirectory(tmp_path / "runs" / "r")
    run.path.mkdir(parents=True)
    run.write_text(run.CONFIG, dump_toml(loaded))
    run.write_text(run.JOURNAL, "")
    run.write_json(run.DATA, meta)
    run.save_normalization(arrays["x_mean"], arrays["x_scale"])
    assert main([str(cfg), "--resume"]) == 0
    capsys.readouterr()
    np.savez(tmp_path / "d.npz", x=x, y=(y + 1) % 3)
    assert main([str(cfg), "--resume"]) == EXIT_PROBLEMS
    assert "was trained on: its" in capsys.readouterr().out          # its targets, or its split's rows


def test_settings_sub_masters_cannot_run_with_are_said_whatever_the_job_size(tmp_path, capsys):
    """sub_masters = 2 with members_per_rank = 2: "No problems found", then every run refused it."""
    cfg = write(tmp_path, 'name = "chk"\n[data]\nsource = "iris"\n[[architectures]]\nmembers = 4\n'
                          'layers = [{type = "Dense", units = 8}]\n[runtime]\ntrainer = "rehearsal"\n'
                          'sub_masters = 2\nmembers_per_rank = 2\n')
    assert check_main(str(cfg)) == EXIT_PROBLEMS
    assert "`runtime.sub_masters = 2` cannot be used: `runtime.members_per_rank` > 1" in capsys.readouterr().out


def test_members_per_rank_where_members_do_not_pack_is_said():
    """`members_per_rank = 2` in a search: check said nothing and the run trained members one by one."""
    from ensemble.config import resolve_config
    from ensemble.orchestrate.prepare import unpacked_note
    search = resolve_config({"mode": "evolve", "runtime": {"members_per_rank": 2}})
    assert unpacked_note(search).startswith("`runtime.members_per_rank = 2` packs no members here (mode 'evolve'")
    listed = {"architectures": [{"layers": [{"type": "Dense", "units": 2}]}], "runtime": {"members_per_rank": 2}}
    assert unpacked_note(resolve_config(listed)) is None
    assert unpacked_note(resolve_config({**listed, "runtime": {"members_per_rank": 2, "precision": "mixed_float16"}}))
