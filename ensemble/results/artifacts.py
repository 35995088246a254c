"""The master's side of retention: what a run keeps on disk, and getting it back on resume.

Workers send the predictions of a member that can enter the candidate set inside its
result (``payload``), and write its model (``models/<id>.keras``) only when it can enter
the kept models (the bars ``Retention.wire`` put in its spec). The master:

- ``accept``: offers every finished member (``Status.OK``; a discarded candidate is no
  candidate) to the ``Retention``; appends a candidate's arrays to the packed store
  (``store/``); replaces each record by the one to journal: its ``payload`` dropped, its
  ``stored`` and ``model`` set (what is kept); returns a ``released`` journal line naming the
  members pushed out, whose model files ``remove_released`` deletes *after* that line is
  written (so a crash in between leaves a stray file, cleaned on resume, never a kept
  member without its model);
- ``restore`` (``--resume``): replays the journal's records and ``released`` lines in
  order, checks that every member still kept has its entry in the store and its model
  file, and returns those that lost them (the store's torn tail after a node crash):
  the run trains exactly those again; members the journal keeps beyond what the one
  retention keeps (several writers' kept sets: a master hierarchy's sub-masters each kept
  its own best) are journalled as released (``"reason": "merged"``) before their files go;
- ``pool``: the members selection may choose (their predictions are stored, and their
  model kept when they wrote one); ``prune``: after selection, removes the models and
  predictions no longer needed and compacts the store.

Every member's metrics, spec and timings stay in the journal whatever is removed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from ensemble.results.events import Event, EventKind
from ensemble.results.records import MemberRecord, as_record
from ensemble.results.retention import Retention
from ensemble.results.rundir import RunDirectory

log = logging.getLogger(__name__)


class Artifacts:
    def __init__(self, run_dir: RunDirectory, metric: str, candidates: int, keep_models: int,
                 objectives: Callable[[MemberRecord], tuple | None] | None = None, writer: int = 0):
        """``writer``: whose files of the store this one appends to (``PackStore``): 0 the
        master's (it reads every writer's), k + 1 sub-master k's (``orchestrate.submasters``)."""
        self.run_dir = run_dir
        self.metric = metric
        self.objectives = objectives
        self.retention = Retention(metric, candidates, keep_models, pareto=objectives is not None)
        self.store = run_dir.store(writer=writer)
        self.has_model: dict[str, bool] = {}       # kept member -> whether it has a model file
        self._to_remove: list[str] = []

    # -- during the run -------------------------------------------------------------------
    def stamp(self, spec: dict) -> dict:
        """Put the current bars into a spec about to be handed out."""
        spec["retain"] = self.retention.wire()
        return spec

    def accept(self, results: list[MemberRecord]) -> list[dict]:
        """Keep what enters (see the module docstring); returns the journal lines to add.

        Each item of ``results`` is replaced, in the list, by the record to journal (its
        ``payload`` dropped, ``stored`` and ``model`` set). TRANSITIONAL: a plain result dict
        is updated in place instead, until the master hands records."""
        released_p, released_m = [], []
        for n, item in enumerate(results):
            r = as_record(item)
            payload = r.extra.get("payload")
            wrote_model = r.has_model
            stored = model = False
            if r.status.ranked:
                objectives = self.objectives(r) if self.objectives else None
                d = self.retention.offer(r.id, r.val.get(self.metric), objectives, r.val.get(self.retention.tie))
                if d.predictions and payload is None:          # a worker without bars that sent nothing
                    self.retention.discard(r.id)
                    d.predictions = d.model = False
                if d.predictions:
                    self.store.put(r.id, payload["arrays"], payload.get("meta"))
                stored, model = d.predictions, d.model and wrote_model
                if d.model:
                    self.has_model[r.id] = wrote_model
                released_p += d.released_predictions
                released_m += d.released_models
            if wrote_model and not model:                      # not ranked, or under a stale bar: never kept
                self._to_remove.append(r.id)
            if isinstance(item, MemberRecord):
                results[n] = r.with_extra(drop=("payload",), stored=stored, model=model)
            else:
                item.pop("payload", None)
                item["stored"], item["model"] = stored, model
        for i in released_m:
            if self.has_model.pop(i, False):
                self._to_remove.append(i)
        if not (released_p or released_m):
            return []
        return [Event(EventKind.RELEASED, {"predictions": released_p, "models": released_m}).to_json()]

    def remove_released(self) -> None:
        """Delete the model files of members no longer kept (call once their line is journalled)."""
        for member_id in self._to_remove:
            self.run_dir.remove_model(member_id)
        self._to_remove.clear()

    # -- resume ---------------------------------------------------------------------------
    def restore(self, history: Iterable[MemberRecord | Event | Mapping[str, Any]], tidy: bool = True) -> set[str]:
        """Rebuild the kept sets from the journal (``RunDirectory.history()``, in order; raw
        lines are read as records and events); returns the ids of members that were kept
        but lost their stored predictions or model file. With ``tidy``, model files of
        members no longer kept are deleted (a resume); without, nothing on disk changes (a
        re-selection reads only)."""
        kept_p: dict[str, MemberRecord] = {}
        kept_m: dict[str, MemberRecord] = {}
        for item in history:
            if isinstance(item, Event) or (not isinstance(item, MemberRecord) and "event" in item):
                event = item if isinstance(item, Event) else Event.from_json(item)
                if event is not None and event.kind is EventKind.RELEASED:
                    for i in event.data.get("predictions", ()):
                        kept_p.pop(i, None)
                    for i in event.data.get("models", ()):
                        kept_m.pop(i, None)
                continue
            r = as_record(item)
            if not r.status.ranked:
                continue
            kept_p.pop(r.id, None)
            kept_m.pop(r.id, None)
            if r.stored:
                kept_p[r.id] = r
            if r.has_model:
                kept_m[r.id] = r
        lost = {i for i in kept_p if i not in self.store}
        lost |= {i for i in kept_m if not self.run_dir.model_intact(i, kept_m[i].model_file)}
        for i, r in {**kept_m, **kept_p}.items():
            if i in lost:
                continue
            self.retention.restore(i, r.val.get(self.metric), self.objectives(r) if self.objectives else None,
                                   r.val.get(self.retention.tie))
            if i in self.retention:
                self.has_model[i] = r.has_model
        models = self.retention.models()
        # Kept by the journal but not by the one retention: several writers' kept sets (a master
        # hierarchy's sub-masters each kept its own best) are more than it keeps. Journalled as
        # released before any file goes, so no later resume takes them for lost.
        over_p = sorted(set(kept_p) - lost - set(self.retention.predictions()))
        over_m = sorted(set(kept_m) - lost - set(models))
        if tidy and (over_p or over_m):
            with self.run_dir.journal() as journal:
                journal.event(Event(EventKind.RELEASED, {"predictions": over_p, "models": over_m,
                                                         "reason": "merged"}).to_json())
        for path in self.run_dir.model_files() if tidy else ():   # stray files: released, or never kept
            member_id = path.name[: -len(RunDirectory.MODEL_SUFFIX)]
            if member_id not in models or not self.has_model.get(member_id, False):
                path.unlink(missing_ok=True)
        if lost:
            names = ", ".join(sorted(lost)[:10]) + (" ..." if len(lost) > 10 else "")
            if tidy:
                log.warning("resume: %d kept member(s) lost their stored predictions or model file "
                            "(a crash before the disk had them); they are trained again: %s", len(lost), names)
            else:                       # a re-selection trains nothing
                log.warning("%d kept member(s) lost their stored predictions or model file, so they are left out "
                            "of this selection: %s; `--resume` of the run trains them again", len(lost), names)
        return lost

    # -- the end ----------------------------------------------------------------------------
    def pool(self) -> list[str]:
        """Ids selection may choose, best first: the kept candidates the store holds (a kept
        candidate that wrote a model keeps it: models are kept for at least as many)."""
        return [i for i in self.retention.predictions() if i in self.store]

    def load(self, member_id: str) -> dict[str, np.ndarray]:
        arrays, _ = self.store.get(member_id)
        return arrays

    def prune(self, selected: Iterable[str]) -> dict:
        """Keep models of the selected, the best ``keep_models`` and the Pareto front, and
        predictions of the selected and the best ``keep_models``; remove the rest. Returns
        the journal line that says so (None when nothing goes) and the counts."""
        keep = self.retention.final_models(selected)
        models = [i for i in self.retention.models() if i not in keep]
        predictions = [i for i in self.retention.predictions() if i not in keep]
        for i in set(models) | set(predictions):
            self.retention.discard(i)
        for i in models:
            if self.has_model.pop(i, False):
                self._to_remove.append(i)
        line = Event(EventKind.RELEASED, {"predictions": predictions, "models": models, "reason": "final"}).to_json() \
            if models or predictions else None
        return {"line": line, "models": len(models), "predictions": len(predictions)}

    def compact(self) -> int:
        """Rewrite the store with the kept predictions only (after ``prune``); bytes freed."""
        live = set(self.retention.predictions())
        if self.store.bytes - self.store.live_bytes() == 0 and live >= set(self.store.index):
            return 0
        return self.store.compact(live)

    def close(self) -> None:
        self.store.close()
