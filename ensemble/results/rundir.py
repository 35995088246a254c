"""The run directory: its layout, atomic writes and the journal, in one object.

Every file a run writes is named here and written through ``atomic_write`` (temporary
name, fsync, rename) or appended to a checked pack (``results.store``), so a killed job
never leaves half a file that looks whole. The number of files does not grow with the
number of members: only kept members have a model file (``results.retention``), and the
candidates' predictions are packed.

    runs/<name>/
      config.toml  data.json  normalization.npz  splits.npz  journal.jsonl
      store/predictions-000.pack   candidates' {val,test}_{pred,var} and history (a new file per GiB)
      journals/sub-<k>.jsonl       a master hierarchy's sub-master k's members, while its job runs
      models/<id>.keras            kept members only
      leaderboard.csv  ensemble.json  ensemble_test_predictions.npz  [search.csv]
      report.html  report/*.png    the run report (``results.report``), remade by ``ensemble.report``
      status.json                  the master's heartbeat (``results.heartbeat``), read by ``ensemble.status``

Runs written before retention had ``members/<id>/model.keras`` and ``scaling.json``;
``legacy_model_path`` finds them so ``ensemble.predict`` still reads such a run (a resume
of such a run is not supported: it finds no stored predictions).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ensemble.config.vocabulary import path_component_problem
from ensemble.results.events import Event
from ensemble.results.journal import Entry, Journal, read_lines, split_history, split_lines, typed_history
from ensemble.results.records import MemberRecord
from ensemble.results.store import PackStore


def atomic_write(path: str | Path, write: Callable[[Path], None]) -> Path:
    """Call ``write(tmp)`` on a temporary name beside ``path``, fsync it, rename it to ``path``.

    The temporary name keeps the suffix (``x.npy`` -> ``x.npy.part.npy``), so writers that
    insist on one (``np.save``, ``model.save``) do not add or refuse it.
    """
    path = Path(path)
    tmp = path.with_name(path.name + ".part" + path.suffix)
    try:
        write(tmp)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:                       # a full disk, an error while writing: no half-file left
        if tmp.is_dir() and not tmp.is_symlink():
            import shutil
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)
        raise
    return path


def write_text_atomic(path: str | Path, text: str) -> Path:
    return atomic_write(path, lambda p: p.write_text(text, encoding="utf-8"))


def _fsync_dir(folder: Path) -> None:
    """Make a folder's renames and removals durable (where the file system lets a folder be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def file_digest(path: str | Path) -> dict[str, Any]:
    """Size and SHA-256 of a file (read in 1 MiB blocks)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return {"bytes": Path(path).stat().st_size, "sha256": h.hexdigest()}


def file_matches(path: str | Path, digest: Mapping[str, Any] | None) -> bool:
    """``path`` is a file and, with a ``digest``, of that size and hash (the size first: a
    truncated file is told without reading it)."""
    path = Path(path)
    if not path.is_file():
        return False
    if not digest:
        return True
    if path.stat().st_size != digest.get("bytes"):
        return False
    return "sha256" not in digest or file_digest(path)["sha256"] == digest["sha256"]


def member_file_name(member_id: str) -> str:
    """``member_id`` as the one path component its files are named by; an id that would
    name a path elsewhere (``../x``, ``/abs``) is refused (ids come from the config's names,
    which are checked, or from a journal, which may not be)."""
    problem = path_component_problem(member_id)
    if problem:
        raise ValueError(f"member id {member_id!r} is not a plain name: it {problem}")
    return member_id

#: what to do about an ensemble.json that cannot be read (cut short, damaged)
DAMAGED_FIX = ("`python -m ensemble.run CONFIG --run-dir RUN --resume` writes it again from the journal "
               "and the stored predictions (nothing is trained again)")


class RunDirectory:
    """A run's directory on disk; paths by role, never spelled out by callers."""

    CONFIG = "config.toml"
    DATA = "data.json"
    NORMALIZATION = "normalization.npz"
    SPLITS = "splits.npz"
    JOURNAL = "journal.jsonl"
    SUB_JOURNALS = "journals"       # a master hierarchy's sub-masters' own journals (``absorb``)
    ABSORBING = "absorbing.json"    # in SUB_JOURNALS: an absorb under way (the journal's size before it)
    STATUS = "status.json"
    LEADERBOARD = "leaderboard.csv"
    ENSEMBLE = "ensemble.json"
    TEST_PREDICTIONS = "ensemble_test_predictions.npz"
    #: where ``ensemble export`` writes each format without OUT (a model of the ensemble.json beside it)
    EXPORTS = {"keras": "ensemble.keras", "saved_model": "ensemble_saved_model", "onnx": "ensemble.onnx"}
    SEARCH_TABLE = "search.csv"
    STARTED_FROM = "started_from.json"  # what a run took from an earlier one (``sources.earlier.kept``)
    STATES = "pbt"                  # mode "pbt": each member's state after a round, two slots each
    MODELS = "models"
    MODEL_SUFFIX = ".keras"
    STORE = "store"
    LEGACY_MEMBERS = "members"
    LEGACY_MODEL = "model.keras"
    LEGACY_SCALING = "scaling.json"

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunDirectory({str(self.path)!r})"

    def __truediv__(self, name: str) -> Path:
        return self.path / name

    # -- whole-run files ------------------------------------------------------------
    def write_text(self, name: str, text: str) -> Path:
        return write_text_atomic(self.path / name, text)

    def write_json(self, name: str, obj) -> Path:
        return self.write_text(name, json.dumps(obj, indent=2, allow_nan=True))

    def write_npz(self, name: str, **arrays: np.ndarray) -> Path:
        return atomic_write(self.path / name, lambda p: np.savez(p, **arrays))

    def stale_exports(self) -> str | None:
        """What to say when ensemble.json changes (reselect, a resume) while ``ensemble export``'s
        default files lie beside it: they hold the previous ensemble. None when there are none."""
        found = [name for name in self.EXPORTS.values() if (self.path / name).exists()]
        if not found:
            return None
        return (f"{', '.join(found)} in {str(self.path)!r} hold(s) the previous ensemble: export again "
                f"(`ensemble export {self.path}`, with `--format` as before) or remove them")

    def archive_ensemble(self, summary: dict) -> str:
        """Keep ``summary`` (the ensemble.json about to be replaced) as ``ensemble-N.json``, the
        first N free, and the test predictions beside it as ``ensemble_test_predictions-N.npz``;
        returns the JSON file's name (``ensemble reselect``, and a resume over a reselected run)."""
        n = 1
        while (self.path / f"ensemble-{n}.json").exists():
            n += 1
        name = f"ensemble-{n}.json"
        self.write_json(name, summary)
        predictions = self.path / self.TEST_PREDICTIONS
        if predictions.is_file():
            atomic_write(self.path / f"ensemble_test_predictions-{n}.npz",
                         lambda p: p.write_bytes(predictions.read_bytes()))
        return name

    def save_normalization(self, shift: np.ndarray, scale: np.ndarray) -> Path:
        return self.write_npz(self.NORMALIZATION, shift=shift, scale=scale)

    def load_normalization(self) -> tuple[np.ndarray, np.ndarray]:
        with np.load(self.path / self.NORMALIZATION) as norm:
            return norm["shift"], norm["scale"]

    def load_splits(self) -> dict[str, np.ndarray]:
        """The run's split: int64 row indices ``train``, ``val``, ``test`` into the data file as
        read (before reshape and normalisation), sorted and disjoint; e.g. ``y[splits["test"]]``
        are the test targets the ensemble was scored on."""
        with np.load(self.path / self.SPLITS) as f:
            return {name: f[name] for name in ("train", "val", "test")}

    # -- the journal ----------------------------------------------------------------
    def has_journal(self) -> bool:
        return (self.path / self.JOURNAL).exists()

    def journal(self, sync_seconds: float = 0.0, before_sync=None) -> Journal:
        """The append-only results journal, opened for appending (torn tail repaired);
        fsynced at most every ``sync_seconds`` (0: on every append), ``before_sync()`` first."""
        return Journal(self.path / self.JOURNAL, sync_seconds, before_sync=before_sync)

    def history(self) -> list[Entry]:
        """The journal, typed and in order: ``MemberRecord``s and ``Event``s (what a resume
        replays)."""
        return typed_history(self.read_lines())

    def records(self) -> tuple[list[MemberRecord], list[Event]]:
        """The journal's member records and its events, typed, each in order: the one reader
        every summary, table, plot and count of a run starts from."""
        return split_history(self.history())

    def read_journal(self, events: bool = False):
        """The member records (and, with ``events``, the run's event lines) as raw dicts;
        readers use ``records()``."""
        return split_lines(self.read_lines(), events)

    def read_lines(self, upto: int | None = None) -> list[dict]:
        """Every whole journal line, records and events, in order, as raw dicts (``history()``
        gives them typed): the journal's, then those of sub-master journals not absorbed yet
        (a hierarchical job that is running or was killed); ``upto``: within the journal's
        first ``upto`` bytes only (what it held when a job began; no sub-master journal)."""
        absorbing = self._absorbing()
        if absorbing is not None:                    # an absorb cut short: its copy is not whole
            upto = absorbing if upto is None else min(upto, absorbing)
        elif upto is not None:
            return read_lines(self.path / self.JOURNAL, upto)
        lines = read_lines(self.path / self.JOURNAL, upto)
        for path in self.sub_journals():
            lines += read_lines(path)
        return lines

    # -- a master hierarchy's sub-master journals ---------------------------------------
    def sub_journal(self, k: int) -> Path:
        """Sub-master ``k``'s own journal (its members' records and ``released`` lines)."""
        return self.path / self.SUB_JOURNALS / f"sub-{k}.jsonl"

    def sub_journals(self) -> list[Path]:
        folder = self.path / self.SUB_JOURNALS
        if not folder.is_dir():
            return []
        return sorted(folder.glob("sub-*.jsonl"), key=lambda p: int(p.stem.rsplit("-", 1)[1])
                      if p.stem.rsplit("-", 1)[1].isdigit() else -1)

    def _absorbing(self) -> int | None:
        """The journal's size before an absorb that did not finish (None: none under way)."""
        try:
            return int(json.loads((self.path / self.SUB_JOURNALS / self.ABSORBING).read_text())["journal_bytes"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def absorb(self) -> list[dict]:
        """Append the sub-master journals' lines to the journal (in sub-master order; each
        file's own order kept), fsync, then remove them; returns the lines absorbed. Only the
        master calls it, when no sub-master writes: at the end of a hierarchical job (its
        sub-masters closed their books) and before a resume (those of a killed job). Crash
        safe: the journal's size is written first (``ABSORBING``, beside the sub journals),
        so an absorb cut short is undone (the journal cut back to that size) and done again by
        the next one, and a reader in between reads the journal only up to that size, then the
        sub journals; once the copy is on disk the folder with the sub journals and the mark
        is renamed away in one step, so no state has the lines in both places unmarked."""
        folder = self.path / self.SUB_JOURNALS
        gone = folder.with_name(folder.name + ".absorbed")
        shutil.rmtree(gone, ignore_errors=True)       # an earlier absorb's, renamed away whole
        subs = self.sub_journals()
        journal = self.path / self.JOURNAL
        before = self._absorbing()
        if before is not None and journal.exists():  # the last absorb was cut short: undo its copy
            with open(journal, "r+b") as fh:
                fh.truncate(before)
                fh.flush()
                os.fsync(fh.fileno())
        if not subs:
            (folder / self.ABSORBING).unlink(missing_ok=True)
            return []
        lines = [line for path in subs for line in read_lines(path)]
        with self.journal() as out:                   # its torn tail repaired first; fsynced on close
            if before is None:
                write_text_atomic(folder / self.ABSORBING, json.dumps({"journal_bytes": out.bytes}))
                _fsync_dir(folder)
            out.extend(lines)
        os.replace(folder, gone)                      # the sub journals and the mark go in one step
        _fsync_dir(self.path)
        shutil.rmtree(gone, ignore_errors=True)
        return lines

    # -- members ----------------------------------------------------------------------
    def store(self, read_only: bool = False, writer: int = 0) -> PackStore:
        """The packed store of the candidates' predictions (opened: its torn tail cut, unless
        ``read_only``: another process may be appending); ``writer``: a sub-master's number
        (``PackStore``: its own files, the master reads them all)."""
        return PackStore(self.path / self.STORE, read_only=read_only, writer=writer)

    def model_ref(self, member_id: str) -> str:
        """How the journal and ensemble.json name a member's model (relative to the run directory)."""
        return f"{self.MODELS}/{member_file_name(member_id)}{self.MODEL_SUFFIX}"

    def inside(self, ref: str) -> Path:
        """The file a run's record names (``ensemble.json``'s ``model``), which must lie inside
        the run directory: an absolute path or one that climbs out is refused (a run from
        someone else must not make predict load, or pruning delete, a file elsewhere)."""
        root = self.path.resolve()
        path = (root / ref).resolve()
        if Path(ref).is_absolute() or not path.is_relative_to(root):
            raise ValueError(f"{ref!r} is outside the run directory {str(self.path)!r}; a run names its files "
                             "relative to itself, so this one has been edited or is not from ensemble.run")
        return path

    def model_path(self, member_id: str) -> Path:
        return self.path / self.model_ref(member_id)

    def legacy_model_path(self, member_id: str) -> Path:
        return self.path / self.LEGACY_MEMBERS / member_file_name(member_id) / self.LEGACY_MODEL

    def model_files(self) -> list[Path]:
        folder = self.path / self.MODELS
        return sorted(folder.glob("*" + self.MODEL_SUFFIX)) if folder.is_dir() else []

    def save_model(self, member_id: str, model) -> dict[str, Any]:
        """A member's Keras model, written whole or not at all; returns its ``file_digest``,
        which the member's record keeps (``model_file``) so resume and predict can tell a
        damaged file from a good one."""
        path = self.model_path(member_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, lambda p: model.save(p))
        return file_digest(path)

    def model_intact(self, member_id: str, digest: Mapping[str, Any] | None) -> bool:
        """Whether the member's model file is there and, where its record has a digest (runs
        since the digest was recorded), has that size and SHA-256."""
        return file_matches(self.model_path(member_id), digest)

    # -- population-based training: a member's state between rounds --------------------
    def state_path(self, member_id: str, round_: int) -> Path:
        """Where a member's state after ``round_`` is: two slots per member (by the round's
        parity), so writing round r+1 never touches the state a resume from round r reads."""
        return self.path / self.STATES / f"{member_file_name(member_id)}.{round_ % 2}.npz"

    def save_state(self, member_id: str, round_: int, arrays: list[np.ndarray], info: dict) -> Path:
        """Weights and optimizer state, packed in one file, written whole or not at all."""
        path = self.state_path(member_id, round_)
        path.parent.mkdir(parents=True, exist_ok=True)
        info = {**info, "member": member_id, "round": round_, "count": len(arrays)}
        named = {f"a{i:05d}": np.asarray(a) for i, a in enumerate(arrays)}
        return atomic_write(path, lambda p: np.savez(p, info=np.asarray(json.dumps(info)), **named))

    def load_state(self, member_id: str, round_: int) -> tuple[list[np.ndarray], dict]:
        """(arrays, info) ``save_state`` wrote for ``member_id`` after ``round_``; raises if the
        slot holds another round (a journal and states that do not belong together)."""
        path = self.state_path(member_id, round_)
        if not path.is_file():
            raise FileNotFoundError(f"{path}: the state of {member_id} after round {round_} is missing; the run "
                                    "cannot continue that member where it stopped")
        with np.load(path) as f:
            info = json.loads(str(f["info"]))
            arrays = [f[f"a{i:05d}"] for i in range(info["count"])]
        if info["round"] != round_:
            raise ValueError(f"{path} holds the state after round {info['round']}, not round {round_}")
        return arrays, info

    def remove_model(self, member_id: str) -> None:
        self.model_path(member_id).unlink(missing_ok=True)
