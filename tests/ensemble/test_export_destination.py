"""``inference.export.safe_destination``: an export never destroys what its destination holds
(a SavedModel replaces its whole directory: `ensemble export RUN work/models` deleted a folder
of notes and another run; `ensemble export ../run ..` began deleting the project)."""

from __future__ import annotations

import pytest

from ensemble.inference.export import safe_destination
from ensemble.inference.load import PredictError


@pytest.fixture
def place(tmp_path, monkeypatch):
    (tmp_path / "project" / "runs" / "r1").mkdir(parents=True)
    (tmp_path / "project" / "here").mkdir()
    monkeypatch.chdir(tmp_path / "project" / "here")
    return tmp_path / "project"


@pytest.mark.parametrize("where, said", [
    ("runs/r1", "is the run directory or a folder holding it"),
    ("runs", "is the run directory or a folder holding it"),
    ("here", "is the working directory or a folder holding it"),
    ("notes", "is not a SavedModel written before"),
    ("models_file", "is not a SavedModel written before"),
])
def test_a_saved_model_never_replaces_a_folder_it_did_not_write(place, where, said):
    (place / "notes").mkdir()
    (place / "notes" / "precious.txt").write_text("mine")
    (place / "models_file").write_text("a file")
    with pytest.raises(PredictError, match=said):
        safe_destination(place / where, "saved_model", place / "runs" / "r1")
    assert (place / "notes" / "precious.txt").read_text() == "mine"


def test_a_saved_model_written_before_and_new_paths_are_fine(place):
    old = place / "exported"
    (old / "variables").mkdir(parents=True)
    (old / "saved_model.pb").write_bytes(b"")
    (old / "fingerprint.pb").write_bytes(b"")
    safe_destination(old, "saved_model", place / "runs" / "r1")                     # replaced: it was ours
    safe_destination(place / "runs" / "r1" / "ensemble_saved_model", "saved_model", place / "runs" / "r1")
    (old / "notes.txt").write_text("mine")
    with pytest.raises(PredictError, match="holds other things"):
        safe_destination(old, "saved_model", place / "runs" / "r1")


def test_a_file_format_refuses_a_folder(place):
    (place / "out.keras").mkdir()
    with pytest.raises(PredictError, match="is a folder; give the keras file to write"):
        safe_destination(place / "out.keras", "keras", place / "runs" / "r1")
    safe_destination(place / "new.keras", "keras", place / "runs" / "r1")


def test_nothing_inside_the_run_directory_but_its_own_export(place):
    """`export RUN RUN/models/mlp-000.keras` wrote over a member's model: the run was damaged."""
    run = place / "runs" / "r1"
    (run / "models").mkdir()
    (run / "models" / "mlp-000.keras").write_text("a member")
    for where in ("models/mlp-000.keras", "models/new.keras", "leaderboard.keras"):
        with pytest.raises(PredictError, match="inside the run directory, whose files are the run's own"):
            safe_destination(run / where, "keras", run)
    safe_destination(run / "ensemble.keras", "keras", run)                 # its own export, written again
    assert (run / "models" / "mlp-000.keras").read_text() == "a member"


def test_a_link_and_an_empty_folder(place, tmp_path):
    (place / "real").mkdir()
    (place / "link").symlink_to(place / "real")
    with pytest.raises(PredictError, match="is a symbolic link"):
        safe_destination(place / "link", "saved_model", place / "runs" / "r1")
    (place / "to_run").symlink_to(place / "runs" / "r1")
    with pytest.raises(PredictError, match="is the run directory"):
        safe_destination(place / "to_run", "saved_model", place / "runs" / "r1")
    safe_destination(place / "real", "saved_model", place / "runs" / "r1")     # empty: nothing to lose
