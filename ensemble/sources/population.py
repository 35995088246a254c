"""mode = "pbt": the master's side of population-based training.

Every worker group holds one member of the population for the whole run and trains it
round by round (``ensemble.train.population``). At the end of each round a member
reports its validation metric and waits; once the whole population has reported, the
master decides every member's next step at once (synchronous rounds, as LTFB):

- exploit: which members copy which (``exploit_pairs``): "truncation" (PBT: the worst
  ``fraction`` copy a random member of the best ``fraction`` that scored better than they did),
  "tournament" (LTFB: random pairs, the loser copies the winner; a tie copies nothing) or "none";
  a member whose loss turned NaN copies a good member under every rule;
- explore: the copy's hyperparameters are perturbed or drawn anew (``explore``);
- the donor is told to send its weights and optimizer state to the receiver's rank and
  the receiver to take them: the state goes worker to worker, never through rank 0.

The round's lineage (each member's metric, hyperparameters, who it copied) is journalled
as one ``pbt_round`` event, fsynced before any member is answered, and every member wrote
its state for that round first (two slots per member: ``pbt/<id>.<round % 2>.npz``). So
``--resume`` continues from the last journalled round: each member loads the state it had
after that round's copies (its donor's file when it copied) and no member starts again
from scratch. ``pbt.csv`` is the lineage, flat. Pure Python + numpy: tested without MPI.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque

import numpy as np

from ensemble.config import ConfigError, RunConfig, member_train_settings
from ensemble.config.schema import PBT_HYPERPARAMETERS
from ensemble.config.schema import PBT_WHAT as WHAT
from ensemble.results.events import Event, EventKind
from ensemble.results.records import MemberRecord
from ensemble.results.rundir import RunDirectory
from ensemble.runtime.executor import CONTINUE, STOP
from ensemble.sources.base import Hooks
from ensemble.sources.members import derive_seed
from ensemble.task import get_task
from ensemble.task.metrics import higher_is_better

log = logging.getLogger(__name__)

#: the bounds a hyperparameter stays in when `pbt.ranges` does not name it
DEFAULT_BOUNDS = {"learning_rate": (1e-6, 1.0), "batch_size": (4, 4096), "dropout": (0.0, 0.9),
                  "weight_decay": (1e-7, 0.1), "momentum": (0.0, 0.999)}
LOG_SCALE = {"learning_rate", "batch_size", "weight_decay"}
TABLE = "pbt.csv"
SEED_SALT = 7_000_001



# -- the rules: pure functions of scores and a generator -----------------------------------------

def exploit_pairs(scores: dict[str, float], rule: str, fraction: float,
                  rng: np.random.Generator) -> list[tuple[str, str]]:
    """(receiver, donor) pairs for one round. ``scores``: higher is better, -inf for a member
    that failed (NaN). Failed members always copy a member of the top ``fraction``."""
    ids = sorted(scores, key=lambda i: (-scores[i], i))          # best first; ties by id
    good = [i for i in ids if math.isfinite(scores[i])]
    bad = [i for i in ids if not math.isfinite(scores[i])]
    n_top = max(1, int(math.floor(len(good) * fraction))) if good else 0
    top = good[:n_top]
    pairs: list[tuple[str, str]] = []
    if rule == "truncation" and len(good) >= 2:
        for receiver in good[len(good) - n_top:]:
            better = [d for d in top if scores[d] > scores[receiver]]    # a tie copies nothing (it only
            if receiver not in top and better:                           # took away a member's own weights)
                pairs.append((receiver, better[int(rng.integers(len(better)))]))
    elif rule == "tournament" and len(good) >= 2:
        order = [good[i] for i in rng.permutation(len(good))]
        for a, b in zip(order[0::2], order[1::2]):
            if scores[a] != scores[b]:
                pairs.append((b, a) if scores[a] > scores[b] else (a, b))
    elif rule not in ("truncation", "tournament", "none"):
        raise ValueError(f"unknown exploit rule {rule!r}")
    for receiver in bad:
        if top:
            pairs.append((receiver, top[int(rng.integers(len(top)))]))
    return pairs


def sample(name: str, bounds: tuple[float, float], rng: np.random.Generator) -> float | int:
    low, high = bounds
    if name in LOG_SCALE:
        value = float(np.exp(rng.uniform(np.log(low), np.log(high))))
    else:
        value = float(rng.uniform(low, high))
    return int(round(value)) if name == "batch_size" else value


def clip(name: str, value: float, bounds: tuple[float, float]) -> float | int:
    value = min(max(value, bounds[0]), bounds[1])
    return max(1, int(round(value))) if name == "batch_size" else float(value)


def explore(hparams: dict, evolving: list[str], rule: str, factors: list[float], resample_probability: float,
            bounds: dict[str, tuple[float, float]], rng: np.random.Generator) -> dict:
    """The hyperparameters a copying member trains with next: each of ``evolving`` multiplied
    by a random one of ``factors`` ("perturb"), or, under "resample", drawn anew from its
    bounds with ``resample_probability`` (else perturbed); kept inside its bounds. One not
    set yet (None: the layer's or optimizer's own) is drawn anew."""
    out = dict(hparams)
    for name in evolving:
        value = out.get(name)
        if value is None or (rule == "resample" and rng.random() < resample_probability):
            out[name] = sample(name, bounds[name], rng)
        else:
            out[name] = clip(name, value * float(factors[int(rng.integers(len(factors)))]), bounds[name])
    return out


# -- the source --------------------------------------------------------------------------------

class PopulationSource:
    """The Source and the Decider of mode "pbt" (one object: the rounds are both).

    ``bind`` gives it the session's hooks: ``answer`` delivers a held decision, ``event``
    journals a round (synced), ``deadline`` ends the rounds in time."""

    def __init__(self, cfg: RunConfig, meta: dict, run_dir: RunDirectory, history: list[MemberRecord | Event],
                 workers: int):
        pbt = cfg.pbt
        self.cfg, self.pbt, self.run_dir = cfg, pbt, run_dir
        task = get_task(meta["task"])
        self.metric = task.default_metric(pbt.metric if pbt.metric != "auto" else cfg.ensemble.metric)
        self.up = higher_is_better(self.metric)
        journalled = next((len(x.data["members"]) for x in history
                           if isinstance(x, Event) and x.kind is EventKind.PBT_ROUND), None)
        self.size = journalled or pbt.population or workers      # a resumed population keeps its size
        if self.size > workers:
            why = (f"the population this run started with has {self.size} members" if journalled else
                   f"`pbt.population` = {pbt.population}")
            raise ConfigError(f"{why}, which needs as many worker groups, but this job has {workers}: every "
                              "member trains every round, each held by one group; start more ranks (mpirun -n "
                              f"{self.size * cfg.runtime.group_size + 1})"
                              + ("" if journalled else " or lower it"))
        self.bounds = {h: tuple(pbt.ranges.get(h, DEFAULT_BOUNDS[h])) for h in PBT_HYPERPARAMETERS}
        self.hooks = Hooks(event=lambda line: None, answer=self._no_answer, deadline=lambda: None, clock=time.time)
        self.members: dict[str, dict] = {}           # id -> its state as the master knows it
        self.reports: dict[str, dict] = {}           # this round's reports, by id
        self.rows: list[dict] = []                   # the lineage so far (pbt.csv)
        self.round = 0                               # the last round every member finished
        self.stopped = False                         # the last journalled round told every member to stop
        self.started: float | None = None            # when the first round began (pbt.time_limit)
        self.spent = 0.0                             # seconds earlier jobs trained rounds (from the journal)
        self.round_started: float | None = None
        self.round_seconds: float | None = None
        self.bytes_moved = 0
        self._initial_population(cfg, meta)
        self.finished = self._replay(history)
        self.active = [i for i in self.members if i not in self.finished]
        self.pending = deque(self._spec(i) for i in self.active)
        self.total = self.size

    # -- the population ----------------------------------------------------------------------
    def bind(self, hooks: Hooks) -> None:
        """The session's hooks: rounds are journalled (``event``) before anyone is answered
        (``answer``); no round starts that would end after ``deadline``."""
        self.hooks = hooks

    @staticmethod
    def _no_answer(spec_id: str, decision: dict) -> None:
        raise RuntimeError("mode \"pbt\" holds members until the round is complete, which needs an executor that "
                           "can answer later (MPI or simulated); bind the session's hooks first")

    def clock(self) -> float:
        return self.hooks.clock()

    def _starts(self, cfg: RunConfig, meta: dict) -> list[dict]:
        """What each initial member is (its ``WHAT`` and training settings), in order."""
        if self.pbt.start:
            from ensemble.sources.earlier import kept
            return kept(self.run_dir, "pbt.start", self.pbt.start,
                        lambda: search_winners(self.pbt.start, self.size, meta, cfg.train.to_dict()))
        out = []
        for i in range(self.size):
            arch = cfg.architectures[i % len(cfg.architectures)].to_dict()
            out.append({"arch": arch["name"], "layers": arch["layers"], "model": arch["model"],
                        "params": arch["params"], "model_dir": arch["model_dir"],
                        **member_train_settings(cfg, cfg.architectures[i % len(cfg.architectures)]).to_dict()})
        return out

    def _initial_population(self, cfg: RunConfig, meta: dict) -> None:
        for i, start in enumerate(self._starts(cfg, meta)):
            rng = np.random.default_rng(derive_seed(cfg.seed, SEED_SALT, i))
            hparams = {"learning_rate": start["learning_rate"], "batch_size": start["batch_size"],
                       "dropout": None, "weight_decay": None, "momentum": None}
            for name in self.pbt.hyperparameters:
                if name in self.pbt.ranges and not self.pbt.start:
                    hparams[name] = sample(name, self.bounds[name], rng)
            member_id = f"pbt-{i:03d}"
            self.members[member_id] = {
                "id": member_id, "index": i, "what": {k: start.get(k) for k in WHAT},
                "hparams": hparams, "train": {k: v for k, v in start.items() if k not in WHAT},
                "seed": derive_seed(cfg.seed, SEED_SALT + 2, i), "restore": None, "exposes": None}

    def _replay(self, history: list[MemberRecord | Event]) -> set[str]:
        """The journal so far: every round's lineage, each member's state after the last round,
        and the members whose final result is in. Returns the finished ids."""
        finished = set()
        opened = last = None                      # this segment's open line and last round, for ``spent``
        for item in history:
            if isinstance(item, Event) and item.kind is EventKind.OPEN:
                if opened is not None and last is not None:
                    self.spent += max(0.0, last - opened)
                opened, last = item.time, None
            if isinstance(item, Event) and item.kind is EventKind.PBT_ROUND:
                x = item.data
                last = item.time if item.time is not None else last
                self.round = x["round"]
                self.stopped = bool(x.get("stop"))
                for row in x["members"]:
                    self.rows.append({"round": x["round"], **row})
                    member = self.members.get(row["id"])
                    if member is None:
                        continue
                    member["what"] = row.get("next_what") or member["what"]
                    member["hparams"] = row["next_hparams"]
                    member["exposes"] = row.get("exposes")
                    member["restore"] = {"round": x["round"], "from": row.get("copied_from") or row["id"],
                                         "stop": self.stopped}
            elif isinstance(item, MemberRecord) and item.ok and item.id in self.members:
                finished.add(item.id)
        if opened is not None and last is not None:
            self.spent += max(0.0, last - opened)
        if self.round:
            log.info(f"resume: the population continues after round {self.round} of {self.pbt.rounds}"
                     + (f" ({len(finished)} member(s) already finished)" if finished else ""))
        return finished

    def _spec(self, member_id: str) -> dict:
        m = self.members[member_id]
        pbt = self.pbt
        return {"id": member_id, **m["what"], **m["train"], "seed": m["seed"],
                "epochs": pbt.rounds * pbt.round_epochs, "report_every": pbt.round_epochs,
                "pbt": {"rounds": pbt.rounds, "round_epochs": pbt.round_epochs, "hparams": m["hparams"],
                        "restore": m["restore"], "metric": self.metric}}

    # -- spec source -------------------------------------------------------------------------
    def next_spec(self) -> dict | None:
        if self.pending:
            if self.round_started is None:
                self.round_started = self.clock()
            return self.pending.popleft()
        return None

    def dry(self) -> bool:
        return False                     # its members train in rounds (or on new data): none is the last

    def tell(self, record: MemberRecord) -> MemberRecord:
        """A member's final result; a member that failed outside a round (an exception, not a
        NaN) leaves the population, which goes on without it."""
        member_id = record.id
        if member_id not in self.members:
            return record
        record = record.replace(extra={**record.extra, "pbt": {
            "rounds": self.round, "hparams": self.members[member_id]["hparams"],
            "what": self.members[member_id]["what"].get("arch")}})
        if member_id in self.active:
            self.active.remove(member_id)
        if not record.ok and not self.stopped:
            log.warning(f"pbt: {member_id} failed ({record.error_kind}); the population "
                        f"goes on with {len(self.active)}")
            self.reports.pop(member_id, None)
            if self.active and len(self.reports) == len(self.active):
                for other, decision in self._complete_round().items():
                    self.hooks.answer(other, decision)
        return record

    # -- the Decider seam: a population decides in rounds, and marks nothing -----------------------
    def stamp(self, spec: dict) -> dict:
        return spec

    def mark(self, record: MemberRecord) -> MemberRecord:
        return record

    def replay(self, records) -> None:
        pass                                          # the source's own ``_replay`` read the rounds

    # -- decisions -----------------------------------------------------------------------------
    def decide(self, spec: dict, payload: dict) -> dict | None:
        """A member finished a round: hold it until the whole population has, then answer all."""
        member_id = spec["id"]
        if "round" not in payload:
            return CONTINUE
        self.reports[member_id] = payload
        if len(self.reports) < len(self.active):
            return None
        decisions = self._complete_round()
        own = decisions.pop(member_id)
        for other, decision in decisions.items():
            self.hooks.answer(other, decision)
        return own

    def _score(self, payload: dict) -> float:
        value = (payload.get("val") or {}).get(self.metric) if payload.get("ok") else None
        if value is None or not math.isfinite(value):
            return -math.inf
        return float(value) if self.up else -float(value)

    def _time_is_up(self, now: float) -> str | None:
        if self.round_started is not None:
            self.round_seconds = now - self.round_started
        ends = [t for t in (self.hooks.deadline(),) if t is not None]
        if self.pbt.time_limit is not None and self.started is not None:
            ends.append(self.started + self.pbt.time_limit)
        if ends and self.round_seconds is not None and now + self.round_seconds > min(ends):
            return "the time limit (`pbt.time_limit` or the run's) would end the next round"
        return None

    def _complete_round(self) -> dict[str, dict]:
        """Every active member has reported this round: journal the lineage, return each one's
        decision (id -> decision)."""
        now = self.clock()
        if self.started is None:                     # back by what earlier jobs spent: the limit counts over jobs
            self.started = (self.round_started if self.round_started is not None else now) - self.spent
        round_ = self.round + 1
        reports = self.reports
        for member_id, payload in reports.items():
            if payload["round"] != round_:
                raise RuntimeError(f"pbt: {member_id} reported round {payload['round']}, but the population "
                                   f"is at round {round_}")
        scores = {i: self._score(p) for i, p in reports.items()}
        why = "the last round" if round_ >= self.pbt.rounds else self._time_is_up(now)
        rng = np.random.default_rng(derive_seed(self.cfg.seed, SEED_SALT + 1, round_))
        pairs = [] if why else exploit_pairs(scores, self.pbt.exploit, self.pbt.fraction, rng)
        if not why and all(not math.isfinite(s) for s in scores.values()):
            why = "every member's loss turned NaN"
        copies = dict(pairs)
        donors: dict[str, list[str]] = {}
        for receiver, donor in pairs:
            donors.setdefault(donor, []).append(receiver)
        decisions, rows = {}, []
        for member_id in sorted(reports):
            payload, member = reports[member_id], self.members[member_id]
            if payload.get("exposes") is not None:
                member["exposes"] = payload["exposes"]
            if payload.get("hparams"):                 # the values unset ones (None) really have
                member["hparams"] = {k: (v if v is not None else payload["hparams"].get(k))
                                     for k, v in member["hparams"].items()}
            row = {"id": member_id, "arch": member["what"].get("arch"), "metric": self.metric,
                   "value": (payload.get("val") or {}).get(self.metric), "ok": bool(payload.get("ok")),
                   "loss": payload.get("loss"), "hparams": member["hparams"], "exposes": member["exposes"],
                   "rank": payload.get("rank"), "seconds": payload.get("seconds"),
                   "state_bytes": payload.get("state_bytes"), "copied_from": None, "next_what": None}
            rows.append(row)
        by_id = {row["id"]: row for row in rows}
        for member_id in sorted(reports):
            member, row = self.members[member_id], by_id[member_id]
            if why:
                decisions[member_id] = STOP
                row["next_hparams"] = member["hparams"]
                continue
            if member_id in copies:
                donor_id = copies[member_id]
                donor = self.members[donor_id]
                evolving = [h for h in self.pbt.hyperparameters
                            if donor["exposes"] is None or h in donor["exposes"]]
                hparams = explore(donor["hparams"], evolving, self.pbt.explore, self.pbt.factors,
                                  self.pbt.resample_probability, self.bounds, rng)
                row.update(copied_from=donor_id, next_hparams=hparams,
                           next_what=donor["what"] if donor["what"] != member["what"] else None)
                decisions[member_id] = {"action": "update", "settings": hparams,
                                        "copy": {"member": donor_id, "rank": reports[donor_id].get("rank"),
                                                 "what": donor["what"], "round": round_}}
                self.bytes_moved += int(reports[donor_id].get("state_bytes") or 0)
            else:
                row["next_hparams"] = member["hparams"]
                decisions[member_id] = ({"action": "continue", "send_to": [reports[r].get("rank") for r in
                                                                           donors[member_id]]}
                                        if member_id in donors else CONTINUE)
        # the new state, after every copy was decided from the old one
        for member_id, row in by_id.items():
            member = self.members[member_id]
            if row.get("copied_from"):
                member["what"] = self.members[row["copied_from"]]["what"]
            member["hparams"] = row["next_hparams"]
        event = {"event": "pbt_round", "round": round_, "time": round(now, 4), "stop": bool(why),
                 "members": rows}
        if why:
            event["why"] = why
        self.hooks.event(event)                   # journalled (and synced) before anyone is answered
        self.rows.extend({"round": round_, **row} for row in rows)
        self.round, self.stopped, self.reports = round_, bool(why), {}
        self.round_started = self.clock()
        best = max(scores, key=lambda i: (scores[i], i))
        value = by_id[best]["value"]
        log.info(f"pbt round {round_}/{self.pbt.rounds}: best {best} val {self.metric} "
                 f"{'nan' if value is None else f'{value:.4f}'}, {len(pairs)} cop{'y' if len(pairs) == 1 else 'ies'}"
                 + (f"; stopping: {why}" if why and round_ < self.pbt.rounds else ""))
        return decisions

    # -- the end ---------------------------------------------------------------------------------
    def finish(self, records: list[MemberRecord] | None = None) -> dict:
        """Write pbt.csv (the lineage, one row per member and round) and return the run
        summary's ``pbt`` section."""
        import pandas as pd
        flat = []
        for row in self.rows:
            out = {k: row.get(k) for k in ("round", "id", "arch", "value", "ok", "loss", "copied_from",
                                           "rank", "seconds", "state_bytes")}
            out[f"val_{self.metric}"] = out.pop("value")
            for name in PBT_HYPERPARAMETERS:
                out[name] = (row.get("hparams") or {}).get(name)
                out[f"next_{name}"] = (row.get("next_hparams") or {}).get(name)
            flat.append(out)
        frame = pd.DataFrame(flat)
        if len(frame):
            frame = frame.sort_values(["round", "id"], kind="stable")
        self.run_dir.write_text(TABLE, frame.to_csv(index=False))
        copies = sum(1 for r in self.rows if r.get("copied_from"))
        return {"pbt": {"rounds": self.round, "population": self.size, "metric": self.metric, "copies": copies,
                "exploit": self.pbt.exploit, "explore": self.pbt.explore,
                "bytes_moved_this_job": self.bytes_moved}}


def search_winners(run_path: str, count: int, meta: dict, train: dict) -> list[dict]:
    """The best ``count`` candidates of a finished mode "evolve" run, as starting members:
    decoded with that run's own search space, with its optimizer, learning rate and batch
    size."""
    from ensemble.sources.earlier import earlier_search
    from evolve import SearchSpace, decode, genome_from_dict
    earlier = earlier_search(run_path, "pbt.start", meta, "\"\" to start from [[architectures]]")
    input_shape, n_outputs = tuple(meta["input_shape"]), meta["n_outputs"]
    space = SearchSpace.from_config(dict(earlier.config.search), input_rank=len(input_shape))
    records = earlier.best_first
    out = []
    for i in range(count):                        # fewer winners than members: dealt round-robin
        record = records[i % len(records)]
        genome = genome_from_dict(record.genome)
        out.append({"arch": record.id, "layers": decode(genome, input_shape, space, n_outputs), "model": None,
                    "params": {}, "model_dir": None, **train, "optimizer": genome.optimizer,
                    "learning_rate": genome.learning_rate, "batch_size": genome.batch_size})
    return out
