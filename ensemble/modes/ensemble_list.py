"""mode = "ensemble": train the ``[[architectures]]`` listed, each ``members`` times."""

from __future__ import annotations

import logging
from collections.abc import Collection
from itertools import chain
from typing import Any

from ensemble.config import RunConfig
from ensemble.modes.base import Mode, RunContext
from ensemble.results.records import MemberRecord, latest
from ensemble.results.rundir import RunDirectory
from ensemble.runtime.executor import Trainer
from ensemble.sources.base import Decider, GoOn, Source
from ensemble.sources.members import CostOrdered, Others, SpecList, member_count, member_specs

log = logging.getLogger(__name__)


class EnsembleMode(Mode):
    name = "ensemble"
    gives_up_crashers = True

    def settled(self, final: dict[str, MemberRecord]) -> set[str]:
        """Finished, or given up as crashers; the failed ones are tried again (after the untried)."""
        return {i for i, r in final.items() if r.ok or r.given_up}

    def make(self, ctx: RunContext) -> tuple[Source, Decider]:
        final = latest(x for x in ctx.history if isinstance(x, MemberRecord))
        settled = self.settled(final)
        done: Collection[str] = settled - set(ctx.lost)
        failed = set(final) - settled
        if ctx.mine is not None:                      # a sub-master's share: the others' count as done here
            done = Others(done, ctx.mine)
        # a resume tries the members never tried before those that failed: a run stopped by
        # `runtime.max_failed_share` handed its failures out first, they failed again, and it stopped again
        if ctx.cfg.runtime.order == "cost":
            return CostOrdered(ctx.cfg, done, total=member_count(ctx.cfg), last=failed), GoOn()
        specs = chain((s for s in member_specs(ctx.cfg, done) if s["id"] not in failed),
                      (s for s in member_specs(ctx.cfg, done) if s["id"] in failed))
        return SpecList(specs, done, total=member_count(ctx.cfg)), GoOn()

    def expected_members(self, cfg: RunConfig, workers: int | None = None) -> int | None:
        return member_count(cfg)

    def describe(self, cfg: RunConfig) -> str:
        n = member_count(cfg)
        return f"{len(cfg.architectures)} architecture(s), {n} member{'s' if n != 1 else ''}"

    def keras_trainer(self, cfg: RunConfig, meta: dict, data: Any, run_dir: RunDirectory, rank: int,
                      group: Any = None, comm: Any = None) -> Trainer:
        """Members one by one, or packed (``runtime.members_per_rank`` > 1, float32, one rank
        per member): the only mode whose members may pack, as they are known in advance."""
        if self.packs(cfg) and group is None:
            return PackingTrainer(cfg.runtime.members_per_rank, data, meta, run_dir, rank)
        return super().keras_trainer(cfg, meta, data, run_dir, rank, group, comm)

    def hierarchy_problem(self, cfg: RunConfig) -> str | None:
        return None                                   # GoOn: nothing is decided while members train

    def sub_master_books(self, cfg: RunConfig) -> bool:
        return True                                   # a fixed list: any share of it runs on its own

    def packs(self, cfg: RunConfig) -> bool:
        """Members pack (``runtime.members_per_rank`` > 1) in float32. A search does not: it
        would breed two packs' worth of candidates per worker before their parents are
        trained (and candidates that report to the master cannot pack); a population trains
        one member per group."""
        rt = cfg.runtime
        return rt.members_per_rank > 1 and rt.precision == "float32"


class PackingTrainer:
    """``runtime.members_per_rank = K``: one spec as usual, or up to K specs of equal
    ``pack_key`` packed into one graph (``ensemble.train.packed``); ``serve`` packs what the
    worker holds. A pack that fails to train as a whole trains its members one by one."""

    looks_ahead = False
    elastic = False                   # a packing run takes no helpers at its end (``runtime.tail``)
    tail = None

    def __init__(self, pack: int, data: Any, meta: dict, run_dir: RunDirectory, rank: int):
        self.pack, self.data, self.meta, self.run_dir, self.rank = pack, data, meta, run_dir, rank

    def __call__(self, spec: dict, report: Any) -> dict | None:
        from ensemble.train.member import run_member
        return run_member(spec, self.data, self.meta, self.run_dir, self.rank, None, report)

    def pack_key(self, spec: dict) -> Any:
        from ensemble.train.packed import pack_key
        return pack_key(spec)

    def ahead(self, upcoming: dict, now: dict) -> None:
        """Nothing: what the worker holds ahead packs with what it trains now."""

    def help(self, spec: dict, leader: int) -> None:
        raise RuntimeError("a packing trainer takes no helpers")

    def train_many(self, specs: list[dict]) -> list[dict]:
        from ensemble.train.member import run_member
        from ensemble.train.packed import train_packed
        try:
            records = train_packed(specs, self.data, self.meta, self.run_dir, self.rank)
        except Exception as exc:              # noqa: BLE001 - a pack that cannot train: one by one instead
            log.warning(f"rank {self.rank}: packing {len(specs)} members failed ({type(exc).__name__}: {exc}); "
                        "training them one by one")
            return [r for r in (run_member(spec, self.data, self.meta, self.run_dir, self.rank) for spec in specs)
                    if r is not None]
        for spec, record in zip(specs, records):
            record.update({k: spec[k] for k in ("genome", "summary") if k in spec})
        return records
