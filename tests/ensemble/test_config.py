"""Config validation: every bad setting fails with a message that names its key."""

import textwrap

import pytest

from ensemble.config import ConfigError, dump_toml, load_config, resolve_config

GOOD = {
    "name": "t",
    "data": {"source": "digits"},
    "architectures": [{"name": "mlp", "members": 2, "layers": [{"type": "Dense", "units": 8}]}],
}


def bad(**patch):
    import copy
    cfg = copy.deepcopy(GOOD)
    for dotted, value in patch.items():
        keys = dotted.split("__")
        node = cfg
        for k in keys[:-1]:
            node = node[int(k)] if isinstance(node, list) else node.setdefault(k, {})
        node[keys[-1]] = value
    return cfg


@pytest.mark.parametrize("cfg, names", [
    (bad(epochz=3), ["`epochz`"]),
    (bad(train__epocs=3), ["`train.epocs`", "did you mean 'epochs'"]),
    (bad(train__epochs="ten"), ["`train.epochs`", "integer"]),
    (bad(train__epochs=0), ["`train.epochs`", "> 0"]),
    (bad(train__learning_rate=-1.0), ["`train.learning_rate`"]),
    (bad(train__optimizer="adma"), ["`train.optimizer`", "did you mean 'adam'"]),
    (bad(train__bootstrap=1), ["`train.bootstrap`", "true/false"]),
    (bad(mode="evolution"), ["`mode`", "'ensemble'"]),
    (bad(data__val_fraction=1.5), ["`data.val_fraction`"]),
    (bad(data__val_fraction=0.5, data__test_fraction=0.45), ["`data.val_fraction`", "`data.test_fraction`"]),
    (bad(data__normalize="zscore"), ["`data.normalize`"]),
    (bad(data__reshape=[8, 0]), ["`data.reshape`"]),
    (bad(architectures__0__layers=[{"type": "Dens", "units": 8}]),
     ["`architectures[0].layers[0].type`", "did you mean 'Dense'"]),
    (bad(architectures__0__layers=[{"type": "Dense", "unit": 8}]),
     ["`architectures[0].layers[0].unit`", "did you mean 'units'"]),
    (bad(architectures__0__layers=[{"type": "Dense"}]), ["`architectures[0].layers[0]`", "`units`"]),
    (bad(architectures__0__layers=[{"type": "dense", "unit": 8}]),      # both at once: it said the type only
     ["`architectures[0].layers[0].type`", "did you mean 'Dense'", "`architectures[0].layers[0].unit`",
      "did you mean 'units'"]),
    (bad(architectures__0__layers=[{"type": "Dropout", "rate": 1.5}]), ["`architectures[0].layers[0].rate`"]),
    (bad(architectures__0__layers=[{"type": "Dense", "units": 8, "activation": "rleu"}]),
     ["`architectures[0].layers[0].activation`", "did you mean 'relu'"]),
    (bad(architectures__0__model="mymodule.build"), ["`architectures[0].model`", "package.module:function"]),
    (bad(architectures__0__members=0), ["`architectures[0].members`"]),
    (bad(architectures=[]), ["[[architectures]]"]),
    (bad(ensemble__k=0), ["`ensemble.k`"]),
    (bad(ensemble__metric="mse", data__task="classification"), ["`ensemble.metric`", "classification"]),
    (bad(runtime__threads=0), ["`runtime.threads`"]),
    (bad(runtime__time_limit=10), ["`runtime.time_limit` = 10 s", "`runtime.finish_reserve` = 30 s"]),  # none starts
    (bad(mode="evolve", evolve__evaluations=None), ["`evolve.evaluations`", "`evolve.time_limit`"]),
    (bad(data="digits"), ["`data`", "table"]),
])
def test_bad_config_names_the_key(cfg, names):
    with pytest.raises(ConfigError) as info:
        resolve_config(cfg)
    for name in names:
        assert name in str(info.value), str(info.value)


def test_both_layers_and_model_is_an_error():
    cfg = bad(architectures__0__model="pkg.mod:fn")
    with pytest.raises(ConfigError, match=r"`architectures\[0\]` needs exactly one of `layers`"):
        resolve_config(cfg)


def test_duplicate_architecture_names():
    cfg = bad(architectures=GOOD["architectures"] * 2)
    with pytest.raises(ConfigError, match="used twice"):
        resolve_config(cfg)


def test_defaults_are_filled_and_per_arch_overrides_kept():
    cfg = resolve_config(bad(architectures__0__learning_rate=0.5))
    assert cfg.train.epochs == 30 and cfg.ensemble.k == 5 and cfg.mode == "ensemble"
    assert cfg.architectures[0].learning_rate == 0.5
    assert cfg.architectures[0].epochs is None                # falls back to [train]


def test_integer_accepted_where_number_expected():
    cfg = resolve_config(bad(train__learning_rate=1))
    assert cfg.train.learning_rate == 1.0 and isinstance(cfg.train.learning_rate, float)


def test_dump_round_trips(tmp_path):
    cfg = resolve_config(GOOD)
    path = tmp_path / "c.toml"
    path.write_text(dump_toml(cfg))
    again = load_config(path)
    assert again == cfg


def test_load_reports_missing_file_and_bad_toml(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.toml")
    path = tmp_path / "bad.toml"
    path.write_text("name = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(path)


def test_relative_data_path_resolves_against_config_dir(tmp_path):
    (tmp_path / "d.npz").write_bytes(b"")
    path = tmp_path / "c.toml"
    path.write_text(textwrap.dedent("""
        [data]
        source = "d.npz"
        [[architectures]]
        layers = [{type = "Dense", units = 4}]
    """))
    cfg = load_config(path)
    assert cfg.data.source == str((tmp_path / "d.npz").resolve())
    assert cfg.name == "c"


def test_a_data_path_with_variables_or_only_from_the_working_directory(tmp_path, monkeypatch):
    """`$SCRATCH/d.npz` was read as '<config folder>/$SCRATCH/d.npz'; a path found only from the
    working directory stayed relative, so a job or a resume started elsewhere read another file."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "d.npz").write_bytes(b"")
    (tmp_path / "configs").mkdir()
    path = tmp_path / "configs" / "c.toml"
    path.write_text('[data]\nsource = "$SCRATCH/d.npz"\n[[architectures]]\nlayers = [{type = "Dense", units = 4}]\n')
    monkeypatch.setenv("SCRATCH", str(tmp_path / "data"))
    assert load_config(path).data.source == str(tmp_path / "data" / "d.npz")
    path.write_text(path.read_text().replace("$SCRATCH", "data"))
    monkeypatch.chdir(tmp_path)
    assert load_config(path).data.source == str((tmp_path / "data" / "d.npz").resolve())
    with pytest.raises(ConfigError, match="is a folder; give the config file"):
        load_config(tmp_path / "configs")


def test_shipped_configs_are_valid():
    from pathlib import Path
    paths = sorted((Path(__file__).parents[2] / "configs").glob("*.toml"))
    # the ones `make demo`, `make evolve-demo` and `make pbt-demo` run are among them (a glob may match nothing)
    assert {"digits.toml", "digits_evolve.toml", "digits_pbt.toml"} <= {p.name for p in paths}
    for path in paths:
        load_config(path)


def test_resume_refuses_a_changed_config(tmp_path):
    from pathlib import Path

    from ensemble.orchestrate.prepare import check_same_run
    cfg = resolve_config(GOOD)
    (tmp_path / "config.toml").write_text(dump_toml(cfg))
    check_same_run(cfg, tmp_path)                                    # unchanged: fine
    check_same_run(cfg.replace(runtime=cfg.runtime.replace(threads=2)), tmp_path)   # runtime may change
    changed = resolve_config(bad(train__epochs=3))
    with pytest.raises(ConfigError, match="differs from the run's saved config.toml"):
        check_same_run(changed, tmp_path)
    # every setting that differs, with both values (it named the table, one a try)
    both = resolve_config(bad(train__epochs=3, seed=5))
    with pytest.raises(ConfigError) as err:
        check_same_run(both, tmp_path)
    text = str(err.value)
    assert f"`train.epochs` {cfg.train.epochs!r} in the run, 3 now" in text
    assert f"`seed` {cfg.seed!r} in the run, 5 now" in text
    layers = cfg.to_dict()["architectures"]
    layers[0]["members"] = layers[0]["members"] + 1
    more = resolve_config({**cfg.to_dict(), "architectures": layers})
    with pytest.raises(ConfigError, match=r"`architectures\[0\]\.members` \d+ in the run, \d+ now"):
        check_same_run(more, tmp_path)
    # the project moved to another file system: the data's paths differ, not the data (the resume
    # compares the data itself: datafeed.prepare.data_changed)
    moved = cfg.replace(data=cfg.data.replace(source="/elsewhere/" + Path(cfg.data.source).name))
    check_same_run(moved, tmp_path)


def test_builder_module_beside_the_config_is_found_from_any_folder(tmp_path, monkeypatch):
    """`model = "mod:fn"` imports like data paths resolve: from the config file's folder first."""
    import sys

    from ensemble.train.architecture import load_builder, use_builder_folders
    folder = tmp_path / "project"
    (folder / "nets").mkdir(parents=True)
    (folder / "beside_cfg_builders.py").write_text("def build(input_shape, n_outputs):\n    return 'built'\n")
    (folder / "nets" / "beside_cfg_pkg").mkdir()
    (folder / "nets" / "beside_cfg_pkg" / "__init__.py").write_text("def build(s, n):\n    return 'pkg'\n")
    path = folder / "c.toml"
    path.write_text(textwrap.dedent("""
        [[architectures]]
        model = "beside_cfg_builders:build"
        [[architectures]]
        model = "beside_cfg_pkg:build"
        model_dir = "nets"
        [[architectures]]
        model = "tests.mpi.user_models:small_mlp"
    """))
    monkeypatch.chdir(tmp_path)                                 # not the config's folder
    monkeypatch.setattr(sys, "path", list(sys.path))
    cfg = load_config(path)
    dirs = [a.model_dir for a in cfg.architectures]
    assert dirs == [str(folder.resolve()), str((folder / "nets").resolve()), None]   # None: from sys.path
    assert use_builder_folders(cfg.architectures) == dirs[:2] and sys.path[:2] == dirs[1::-1]
    assert load_builder("beside_cfg_builders:build")((4,), 2) == "built"
    assert load_builder("beside_cfg_pkg:build")((4,), 2) == "pkg"
    saved = tmp_path / "saved.toml"                             # the run directory's config.toml reads back
    saved.write_text(dump_toml(cfg))
    again = resolve_config(__import__("tomllib").loads(saved.read_text()), saved=True)
    assert again.architectures == cfg.architectures


def test_model_dir_must_be_a_folder_and_needs_a_model(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[[architectures]]\nmodel = "m:f"\nmodel_dir = "nowhere"\n')
    with pytest.raises(ConfigError, match=r"`architectures\[0\].model_dir` 'nowhere' is not a folder"):
        load_config(path)
    with pytest.raises(ConfigError, match=r"`architectures\[0\].model_dir` is where a user builder's module"):
        resolve_config({"architectures": [{"layers": [{"type": "Dense", "units": 4}], "model_dir": "x"}]})


def test_resume_ignores_where_the_builder_is_imported_from(tmp_path):
    from ensemble.orchestrate.prepare import check_same_run
    cfg = resolve_config({"architectures": [{"model": "m:f", "model_dir": "/old/place"}]})
    (tmp_path / "config.toml").write_text(dump_toml(cfg))
    moved = resolve_config({"architectures": [{"model": "m:f", "model_dir": "/new/place"}]})
    check_same_run(moved, tmp_path)
