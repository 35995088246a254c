"""MLflow tracking from the master (``[tracking] mlflow = "<tracking URI>"``).

One parent run per job (named after the run directory), one nested run per member
(``mlflow.parentRunId``) with its hyperparameters as params, its per-epoch history and
final metrics, and its status (FINISHED, FAILED, or KILLED for a member the master or a
limit stopped); at the end the ensemble's metrics on the parent and ``ensemble.json`` and
``report.html`` as its artifacts. The parent's id is kept in ``RUN_DIR/mlflow.json``, so a
resumed job continues the same parent run.

Every call is made from ``tracking.Background``'s thread, which batches and retries them.
MLflow's own HTTP retries (7, with backoff, and a 120 s timeout by default) would hold a
call for minutes, so unless the user set them, this process asks for none and a short
timeout: the retrying is ``Background``'s, bounded by ``tracking.give_up_seconds``.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ensemble.results.rundir import write_text_atomic
from ensemble.results.tracking import MemberView

#: where a job keeps its parent run's id, for --resume
RUN_FILE = "mlflow.json"
#: member runs written at once (each is three requests that mostly wait on the server)
PARALLEL = 8
#: MLflow's limits per log_batch call
MAX_METRICS, MAX_PARAMS = 1000, 100
_STATUS = {"ok": "FINISHED", "discarded": "KILLED", "stopped": "KILLED", "limit": "KILLED", "failed": "FAILED"}
#: a nested run in one of these states was written whole
_ENDED = frozenset(_STATUS.values())


def _chunks(items: list, size: int) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)] or [[]]


class MlflowSink:
    """The parent run, nested member runs and the ensemble's metrics and files."""

    name = "mlflow"

    def __init__(self, uri: str, experiment: str, run_dir: Path, cfg: Any, meta: Mapping[str, Any],
                 resume: bool):
        self._client = None
        self.uri, self.experiment, self.run_dir = uri, experiment, Path(run_dir)
        self.resume = resume
        self.where = f"MLflow {uri}, experiment {experiment!r}"
        self.params = {"mode": cfg.mode, "seed": cfg.seed, "task": meta.get("task"),
                       "data.source": cfg.data.source, "ensemble.k": cfg.ensemble.k,
                       "ensemble.method": cfg.ensemble.method, "train.epochs": cfg.train.epochs}
        self.parent: str | None = None
        self.experiment_id: str | None = None
        self.written: set[str] = set()
        self.attempted: set[str] = set()
        self.token = uuid.uuid4().hex[:12]          # this job's runs, for idempotent retries

    @property
    def client(self):
        """The MLflow client, made in the sink's thread on first use (importing MLflow takes
        seconds, which the master's start does not wait for)."""
        if self._client is None:
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
            os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")   # and its get_run per run
            logging.getLogger("mlflow").setLevel(logging.WARNING)     # no "View run ..." line per member
            from mlflow.tracking import MlflowClient
            self._client = MlflowClient(tracking_uri=self.uri)
        return self._client

    def _parent(self) -> str:
        """The job's parent run: the one ``mlflow.json`` names (same server), else a new one."""
        if self.parent is not None:
            return self.parent
        saved = self.run_dir / RUN_FILE
        if saved.exists():
            known = json.loads(saved.read_text())
            if known.get("tracking_uri") == self.uri:
                run = self.client.get_run(known["run_id"])
                self.experiment_id, self.parent = run.info.experiment_id, run.info.run_id
                self.client.update_run(self.parent, status="RUNNING")
                return self.parent
        exp = self.client.get_experiment_by_name(self.experiment)
        self.experiment_id = exp.experiment_id if exp is not None else self.client.create_experiment(self.experiment)
        run = self._create(f"job-{self.token}", self.run_dir.name, {"run_dir": str(self.run_dir.resolve())})
        self.parent = run.info.run_id
        write_text_atomic(saved, json.dumps({"tracking_uri": self.uri, "experiment_id": self.experiment_id,
                                             "run_id": self.parent}, indent=1) + "\n")
        self._log(self.parent, [], {k: v for k, v in self.params.items() if v is not None})
        return self.parent

    def _create(self, key: str, name: str, tags: dict[str, str], start: int | None = None):
        """``create_run``, idempotent across retries: a call that timed out may have created
        the run on the server, so a second attempt first looks for it by its ``ensemble_key`` tag."""
        if key in self.attempted:
            found = self.client.search_runs([self.experiment_id], filter_string=f"tags.ensemble_key = '{key}'",
                                            max_results=1)
            if found:
                return found[0]
        self.attempted.add(key)
        return self.client.create_run(self.experiment_id, run_name=name, start_time=start,
                                      tags={**tags, "ensemble_key": key})

    def _log(self, run_id: str, metrics: list, params: Mapping[str, Any]) -> None:
        """log_batch within MLflow's limits per call."""
        from mlflow.entities import Param
        mparts = _chunks(metrics, MAX_METRICS)
        pparts = _chunks([Param(str(k), str(v)[:6000]) for k, v in params.items()], MAX_PARAMS)
        for i in range(max(len(mparts), len(pparts))):
            m, p = mparts[i] if i < len(mparts) else [], pparts[i] if i < len(pparts) else []
            if m or p:
                self.client.log_batch(run_id, metrics=m, params=p)

    def members(self, views: list[MemberView]) -> None:
        """Each member as a nested run, ``PARALLEL`` requests at a time (a member's three calls
        wait on the server, not on this process). A retried batch may meet members already
        written: those are skipped (the ``written`` set of ``MemberView.key``), so a retry never
        duplicates a run."""
        parent = self._parent()
        todo = [v for v in views if v.key not in self.written]
        if len(todo) <= 1:
            for view in todo:
                self._member(view, parent)
            return
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(min(PARALLEL, len(todo)), thread_name_prefix="mlflow") as pool:
            for future in [pool.submit(self._member, view, parent) for view in todo]:
                future.result()                        # the first error makes the batch retried

    def known(self, views: list[MemberView]) -> None:
        """Members earlier jobs ended (``--resume``): a member the parent run holds whole (a
        nested run ended with the member's status) is skipped; a nested run an earlier job
        left unfinished (RUNNING: it died mid-write) is deleted; the rest are written now."""
        parent = self._parent()
        held: dict[str, set[str]] = {}
        token = None
        while True:
            page = self.client.search_runs([self.experiment_id], max_results=1000, page_token=token,
                                           filter_string=f"tags.mlflow.parentRunId = '{parent}'")
            for run in page:
                if run.info.status in _ENDED:
                    held.setdefault(run.data.tags.get("member", run.info.run_name), set()).add(run.info.status)
                else:
                    self.client.delete_run(run.info.run_id)
            token = page.token
            if not token:
                break
        self.members([v for v in views if _STATUS.get(v.status, "FAILED") not in held.get(v.id, ())])

    def _member(self, view: MemberView, parent: str) -> None:
        from mlflow.entities import Metric
        stamp = int(1000 * (view.ended or time.time()))
        run = self._create(f"{self.token}-{view.key}", view.id,
                           {"mlflow.parentRunId": parent, "member": view.id, "status": view.status}, stamp)
        metrics = [Metric(key, float(v), stamp, epoch + 1)
                   for key, values in view.history.items() for epoch, v in enumerate(values)]
        last = max((len(v) for v in view.history.values()), default=int(view.hparams.get("epochs") or 0))
        metrics += [Metric(key.replace("/", "_"), float(v), stamp, last) for key, v in view.final.items()]
        if view.train_seconds is not None:
            metrics.append(Metric("train_seconds", float(view.train_seconds), stamp, last))
        self._log(run.info.run_id, metrics, view.hparams)
        self.client.set_terminated(run.info.run_id, status=_STATUS.get(view.status, "FAILED"), end_time=stamp)
        self.written.add(view.key)

    def ensemble(self, summary: dict, files: list[Path]) -> None:
        from mlflow.entities import Metric
        parent = self._parent()
        stamp = int(1000 * time.time())
        metrics = []
        for who in ("ensemble", "best_member"):
            part = summary.get(who) or {}
            for split in ("val", "test"):
                for name, value in (part.get(split) or {}).items():
                    if isinstance(value, (int, float)):
                        key = f"{split}_{name}" if who == "ensemble" else f"best_member_{split}_{name}"
                        metrics.append(Metric(key, float(value), stamp, 0))
        counts = {k: summary[k] for k in ("n_finished", "n_failed", "n_discarded") if isinstance(summary.get(k), int)}
        metrics += [Metric(k, float(v), stamp, 0) for k, v in counts.items()]
        self._log(parent, metrics, {})
        for path in files:
            self.client.log_artifact(parent, str(path))

    def close(self, ok: bool) -> None:
        if self.parent is None:
            return
        try:
            self.client.set_terminated(self.parent, status="FINISHED" if ok else "FAILED")
        except Exception:                  # noqa: BLE001 - the end of a run never fails over tracking
            pass
