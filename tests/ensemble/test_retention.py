"""Retention, the packed store and the master's artifacts: bounded sets, torn tails, resume."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ensemble.config import resolve_config
from ensemble.results.artifacts import Artifacts
from ensemble.results.records import MemberRecord
from ensemble.results.retention import ParetoFront, Retention, passes
from ensemble.results.rundir import RunDirectory
from ensemble.results.selection import rank_key, select
from ensemble.results.store import PackStore, encode
from ensemble.results.summary import build_ensemble


def offered(n, rng, ties=True):
    """(id, value) pairs with many ties and a few non-finite values."""
    values = rng.integers(0, 12, n) / 12 if ties else rng.random(n)
    out = [(f"m-{i:04d}", float(v)) for i, v in enumerate(values)]
    out[3] = ("m-0003", float("nan"))
    return out


@pytest.mark.parametrize("metric", ["accuracy", "log_loss"])
def test_retention_keeps_exactly_the_best_in_any_order(metric):
    rng = np.random.default_rng(1)
    members = offered(300, rng)
    higher = metric == "accuracy"
    finite = [(i, v) for i, v in members if np.isfinite(v)]
    best = [i for i, v in sorted(finite, key=lambda p: rank_key(p[1], p[0], higher))]
    for _ in range(5):
        order = [members[j] for j in rng.permutation(len(members))]
        ret = Retention(metric, candidates=20, keep_models=35)
        kept_p, kept_m = set(), set()
        for member_id, value in order:
            d = ret.offer(member_id, value)
            assert not d.predictions or d.model                    # a candidate keeps its model
            kept_p |= {member_id} if d.predictions else set()
            kept_m |= {member_id} if d.model else set()
            kept_p -= set(d.released_predictions)
            kept_m -= set(d.released_models)
            assert len(kept_p) <= 20 and len(kept_m) <= 35
        assert ret.predictions() == best[:20]                     # ties broken by id, same every order
        assert kept_p == set(best[:20]) and kept_m == set(best[:35]) == ret.models()
        assert ret.final_models(["m-0299"]) == set(best[:35]) | {"m-0299"}


def test_a_member_the_bars_refuse_would_not_have_been_kept():
    """Workers decide with bars that may be stale; a refusal must never lose a member the
    master would have kept (bars only get stricter)."""
    rng = np.random.default_rng(2)
    ret = Retention("log_loss", candidates=10, keep_models=10)
    in_flight = []
    for member_id, value in offered(400, rng, ties=True):
        in_flight.append((member_id, value, ret.wire()))             # dispatched with today's bars
        if len(in_flight) > 8:                                      # arrives several results later
            mid, val, bars = in_flight.pop(rng.integers(len(in_flight)))
            wants = passes(bars, "predictions", {"log_loss": val}, mid)
            d = ret.offer(mid, val)
            assert wants or not d.predictions, (mid, val, bars)
            assert passes(bars, "models", {"log_loss": val}, mid) or not d.model
    assert passes(None, "models", {}, "x")                             # no bars: keep everything
    assert not passes({"metric": "mse", "higher": False, "predictions": None}, "predictions", {"mse": float("nan")},
                      "x")


def test_pareto_front_keeps_non_dominated_models():
    ret = Retention("accuracy", candidates=1, keep_models=1, pareto=True)
    assert ret.offer("a", 0.9, (0.9, -1000)).model
    small = ret.offer("b", 0.8, (0.8, -10))                          # worse metric, far smaller: on the front
    assert small.model and not small.predictions
    d = ret.offer("c", 0.7, (0.7, -500))                             # dominated by b: nothing
    assert not d.model
    d = ret.offer("d", 0.85, (0.85, -5))                             # dominates b: b's model goes
    assert d.model and d.released_models == ["b"]
    assert ret.models() == {"a", "d"} and ret.bars()["models"] is None    # workers always write models
    front = ParetoFront()
    assert front.add("x", (1, 1))[0] and front.add("y", (1, 1))[0]   # equal points both stay


# ------------------------------------------------------------------------------ the store
def arrays(i, n=30, c=4):
    rng = np.random.default_rng(i)
    return {"val_pred": rng.random((n, c)).astype(np.float32), "test_pred": rng.random((n + 1, c))}


def test_store_round_trip_reopen_roll_and_compact(tmp_path):
    store = PackStore(tmp_path / "store", roll_bytes=4000)
    for i in range(10):
        store.put(f"m{i}", arrays(i), {"history": {"loss": [1.0, 0.5]}})
    assert len(store.files) > 1                                       # rolled
    got, meta = store.get("m3")
    np.testing.assert_array_equal(got["val_pred"], arrays(3)["val_pred"])
    assert got["test_pred"].dtype == np.float64 and meta == {"history": {"loss": [1.0, 0.5]}}
    store.close()
    again = PackStore(tmp_path / "store")
    assert set(again.index) == {f"m{i}" for i in range(10)} and again.lost_bytes == 0
    freed = again.compact({"m1", "m7"})
    assert freed > 0 and len(again.files) == 1 and set(again.index) == {"m1", "m7"}
    np.testing.assert_array_equal(PackStore(tmp_path / "store").get("m7")[0]["test_pred"], arrays(7)["test_pred"])


@pytest.mark.parametrize("cut", [1, 17, 200, "zeros"])
def test_store_torn_tail_is_cut_and_what_was_before_stays_whole(tmp_path, cut):
    store = PackStore(tmp_path)
    for i in range(5):
        store.put(f"m{i}", arrays(i))
    store.close()
    path = store.files[0]
    size = path.stat().st_size
    if cut == "zeros":                            # a node crash: length grew, data never written
        with open(path, "ab") as fh:
            fh.write(bytes(5000))
    else:
        with open(path, "r+b") as fh:
            fh.truncate(size - cut)
    again = PackStore(tmp_path)
    whole = {f"m{i}" for i in range(5 if cut == "zeros" else 4)}
    assert set(again.index) == whole and again.lost_bytes > 0
    for i in whole:
        np.testing.assert_array_equal(again.get(i)[0]["val_pred"], arrays(int(i[1:]))["val_pred"])
    again.put("m9", arrays(9))                                       # appends after the cut
    again.close()
    assert set(PackStore(tmp_path).index) == whole | {"m9"}


def test_a_read_only_store_reads_while_another_appends_and_never_cuts(tmp_path):
    """The tracking writer reads earlier members' histories while the master appends: an
    entry half-written at that moment is a torn tail to the reader, which must leave it."""
    store = PackStore(tmp_path)
    for i in range(3):
        store.put(f"m{i}", arrays(i), {"history": {"loss": [1.0 / (i + 1)]}})
    store.sync()
    whole = store.files[0].stat().st_size
    blob = encode("m3", arrays(3))
    with open(store.files[0], "ab") as fh:                         # the master, mid-append
        fh.write(blob[:40])
    reader = PackStore(tmp_path, read_only=True)
    assert set(reader.index) == {"m0", "m1", "m2"}
    assert reader.get("m1")[1] == {"history": {"loss": [0.5]}}
    assert store.files[0].stat().st_size == whole + 40              # nothing cut under the writer
    with pytest.raises(ValueError, match="read-only"):
        reader.put("m9", arrays(9))


def test_store_skips_a_damaged_entry_in_the_middle(tmp_path):
    store = PackStore(tmp_path)
    for i in range(3):
        store.put(f"m{i}", arrays(i))
    _, offset, length = store.index["m1"]
    store.close()
    with open(store.files[0], "r+b") as fh:
        fh.seek(offset + length - 10)
        fh.write(b"\xff" * 4)
    again = PackStore(tmp_path)
    assert set(again.index) == {"m0", "m2"}


@pytest.mark.parametrize("where", ["magic", "lengths", "zeroed block"])
def test_a_damaged_entry_header_costs_that_entry_only_and_nothing_is_cut(tmp_path, where):
    """A flipped bit in one entry's magic or length must not make the scan take the rest of
    the file for a torn tail: the entries after it are found again and kept on disk."""
    store = PackStore(tmp_path)
    for i in range(7):
        store.put(f"m{i}", arrays(i))
    _, offset, length = store.index["m1"]
    store.close()
    path = store.files[0]
    size = path.stat().st_size
    with open(path, "r+b") as fh:
        if where == "magic":
            fh.seek(offset)
            fh.write(b"EPK0")
        elif where == "lengths":
            fh.seek(offset + 8)
            fh.write(b"\xff" * 8)                                   # a payload length past the file's end
        else:
            fh.seek(offset + 3)
            fh.write(bytes(length - 20))
    again = PackStore(tmp_path)
    assert set(again.index) == {"m0", *(f"m{i}" for i in range(2, 7))}
    assert path.stat().st_size == size                               # nothing valid was cut
    for i in range(2, 7):
        np.testing.assert_array_equal(again.get(f"m{i}")[0]["val_pred"], arrays(i)["val_pred"])


# ------------------------------------------------------------------------- master + resume
def members(n, rng, c=3, rows=40):
    y = rng.integers(0, c, rows)
    out = []
    for i in range(n):
        quality = rng.uniform(0.3, 0.95)
        right = rng.random(rows) < quality
        top = np.where(right, y, (y + 1) % c)
        p = rng.dirichlet(np.ones(c), rows) * 0.5
        p[np.arange(rows), top] += 0.5
        out.append((f"m-{i:03d}", p))
    return y, out


def result(member_id, p, y, retain=None):
    from ensemble.task import get_task
    from ensemble.train.member import candidate_payload
    task = get_task("classification")
    val = task.metrics(y, p)
    r = {"id": member_id, "status": "ok", "val": val, "test": val, "model": False, "seed": 0}
    r.update(candidate_payload({"id": member_id, "retain": retain}, val, {"val": p, "test": p},
                               {"val": None, "test": None}))
    return MemberRecord.from_json(r)


def config(**ensemble):
    return resolve_config({"data": {"source": "digits"}, "ensemble": ensemble,
                           "architectures": [{"layers": [{"type": "Dense", "units": 4}]}]})


def records_of(lines):
    return [x for x in lines if isinstance(x, MemberRecord)]


def run_master(run_dir, y, specs, candidates, keep_models=0, batch=3):
    """The master's side of retention over results arriving in batches; returns the journal
    lines (``accept`` puts the records as journalled in place of those it was given)."""
    art = Artifacts(run_dir, "log_loss", candidates, keep_models)
    lines, queue = [], []
    for member_id, p in specs:
        queue.append(result(member_id, p, y, art.stamp({})["retain"]))
        if len(queue) == batch:
            lines += queue + art.accept(queue)
            queue = []
    lines += queue + art.accept(queue)
    art.close()
    return art, lines


def test_selection_over_candidates_equals_selection_over_all_when_all_are_candidates(tmp_path):
    rng = np.random.default_rng(4)
    y, specs = members(40, rng)
    cfg = config(metric="log_loss", method="greedy", k=5)
    meta = {"task": "classification"}
    art, lines = run_master(RunDirectory(tmp_path / "all"), y, specs, candidates=40)
    assert not any("payload" in r.extra for r in records_of(lines))        # the arrays went to the store
    ens = build_ensemble(RunDirectory(tmp_path / "all"), records_of(lines), cfg, meta, y, y, art)
    direct = select(dict(specs), y, "log_loss", method="greedy", k=5, task="classification")
    assert [(m["id"], m["weight"]) for m in ens["members"]] == list(direct.items())
    common = int(np.bincount(y).argmax())                 # the reference an imbalanced test is read against
    assert ens["majority"]["test_accuracy"] == pytest.approx(np.mean(y == common))
    # a bounded pool: the same greedy over exactly the best 8 by validation log loss
    art8, lines8 = run_master(RunDirectory(tmp_path / "eight"), y, specs, candidates=8)
    best8 = [r.id for r in sorted(records_of(lines8), key=lambda r: rank_key(r.val["log_loss"], r.id, False))][:8]
    assert art8.pool() == best8 and len(art8.store) > 8                  # released entries until compacted
    ens8 = build_ensemble(RunDirectory(tmp_path / "eight"), records_of(lines8), cfg, meta, y, y, art8)
    direct8 = select({i: p for i, p in specs if i in best8}, y, "log_loss", method="greedy", k=5)
    assert [(m["id"], m["weight"]) for m in ens8["members"]] == list(direct8.items())
    assert sum(1 for x in records_of(lines8) if x.stored) < 40            # the bars kept most arrays home


def test_resume_after_a_torn_store_retrains_only_what_was_lost(tmp_path):
    rng = np.random.default_rng(5)
    y, specs = members(30, rng)
    run_dir = RunDirectory(tmp_path)
    art, lines = run_master(run_dir, y, specs, candidates=6)
    kept = set(art.pool())
    path = art.store.files[0]
    entries = sorted(art.store.index.items(), key=lambda kv: kv[1][1])
    live_tail = [i for i, _ in entries if i in kept][-2:]             # cut into the last two kept ones
    first = art.store.index[live_tail[0]][1]
    with open(path, "r+b") as fh:
        fh.truncate(first + 10)
    again = Artifacts(run_dir, "log_loss", 6, 0)
    lost = again.restore(lines)
    assert lost == set(live_tail)
    assert set(again.pool()) == kept - lost
    # a clean store: nothing lost, the same kept set, the same bars
    run_dir2 = RunDirectory(tmp_path / "clean")
    art2, lines2 = run_master(run_dir2, y, specs, candidates=6)
    restored = Artifacts(run_dir2, "log_loss", 6, 0)
    assert restored.restore(lines2) == set() and restored.pool() == art2.pool()
    assert restored.retention.wire() == art2.retention.wire()


def test_released_models_are_removed_after_their_line_and_strays_on_resume(tmp_path):
    run_dir = RunDirectory(tmp_path)
    art = Artifacts(run_dir, "accuracy", candidates=2, keep_models=2)
    lines = []
    for i, acc in enumerate([0.5, 0.6, 0.9, 0.4]):
        member_id = f"m{i}"
        run_dir.model_path(member_id).parent.mkdir(exist_ok=True)
        run_dir.model_path(member_id).write_text("model")             # the worker wrote it
        r = {"id": member_id, "status": "ok", "val": {"accuracy": acc}, "model": True,
             "payload": {"arrays": {"val_pred": np.zeros((2, 2))}}}
        batch = [MemberRecord.from_json(r)]
        lines += batch + art.accept(batch)
        art.remove_released()
    assert {p.stem for p in run_dir.model_files()} == {"m1", "m2"}
    assert [x["models"] for x in lines if isinstance(x, dict) and x.get("event") == "released"] == [["m0"]]
    assert lines[-1].has_model is False and lines[-1].extra["model"] is False   # m3 arrived below the bar
    run_dir.model_path("m0").write_text("stray")                       # a crash before the removal
    again = Artifacts(run_dir, "accuracy", 2, 2)
    assert again.restore(lines) == set() and {p.stem for p in run_dir.model_files()} == {"m1", "m2"}
    pruned = again.prune(["m2"])                                       # keep_models 2: nothing to prune
    assert pruned["line"] is None
    json.dumps([x if isinstance(x, dict) else x.to_json() for x in lines], default=str)


def test_a_run_stopped_early_keeps_every_candidate_and_a_finished_one_prunes(tmp_path):
    from ensemble.results.summary import finalize
    rng = np.random.default_rng(6)
    y, specs = members(20, rng)
    cfg = config(metric="log_loss", method="top_k", k=2)
    meta = {"task": "classification"}
    run_dir = RunDirectory(tmp_path)
    art, lines = run_master(run_dir, y, specs, candidates=8, keep_models=3)
    records = records_of(lines)
    art = Artifacts(run_dir, "log_loss", 8, 3)
    assert art.restore(lines) == set()
    early = finalize(run_dir, records, cfg, meta, y, y, artifacts=art, prune=False)
    assert "not_pruned" in early["kept"] and art.pool() == art.retention.predictions() and len(art.pool()) == 8
    done = finalize(run_dir, records, cfg, meta, y, y, artifacts=art, prune=True)
    assert done["members"] == early["members"]
    best3 = art.retention.predictions()
    assert len(best3) == 3 and set(m["id"] for m in done["members"]) <= set(best3)    # top_k 2 within the best 3
    assert set(PackStore(tmp_path / "store").index) == set(best3) and done["kept"]["store_bytes_freed"] > 0
    released = [x for x in run_dir.read_lines() if x.get("reason") == "final"]
    assert len(released) == 1 and len(released[0]["predictions"]) == 5


def test_a_discarded_or_failed_member_is_no_candidate_and_its_model_goes(tmp_path):
    """Only ``Status.OK`` members enter retention; a discarded candidate (an older journal's
    "ok" with ``discarded`` too) or a failed one that wrote a model has it removed."""
    run_dir = RunDirectory(tmp_path)
    art = Artifacts(run_dir, "accuracy", candidates=4, keep_models=4)
    payload = {"arrays": {"val_pred": np.zeros((2, 2))}}
    batch = [MemberRecord.from_json(x) for x in (
        {"id": "ok", "status": "ok", "val": {"accuracy": 0.5}, "model": True, "payload": payload},
        {"id": "old", "status": "ok", "val": {"accuracy": 0.9}, "model": True, "payload": payload,
         "discarded": {"epoch": 2}},
        {"id": "new", "status": "discarded", "val": {"accuracy": 0.9}, "model": True, "discarded": {"epoch": 2}},
        {"id": "bad", "status": "failed", "error": {"kind": "nan_loss"}})]
    for r in batch:
        run_dir.model_path(r.id).parent.mkdir(exist_ok=True)
        run_dir.model_path(r.id).write_text("model")
    assert art.accept(batch) == []
    art.remove_released()
    assert [(r.id, r.stored, r.has_model) for r in batch] == [("ok", True, True), ("old", False, False),
                                                              ("new", False, False), ("bad", False, False)]
    assert art.pool() == ["ok"] and {p.stem for p in run_dir.model_files()} == {"ok", "bad"}
    again = Artifacts(run_dir, "accuracy", 4, 4)                 # resume: the same kept set, from the history
    assert again.restore([*batch]) == set() and again.pool() == ["ok"]
    art.close()
    again.close()


def test_a_plain_result_dict_is_still_updated_in_place():
    """TRANSITIONAL: the master hands dicts until it hands records."""
    import tempfile
    with tempfile.TemporaryDirectory() as folder:
        art = Artifacts(RunDirectory(folder), "accuracy", candidates=2, keep_models=0)
        r = {"id": "m", "status": "ok", "val": {"accuracy": 0.5}, "payload": {"arrays": {"val_pred": np.zeros(2)}}}
        art.accept([r])
        assert r["stored"] is True and r["model"] is False and "payload" not in r
        art.close()


def test_leaderboard_and_ensemble_json_count_every_status_alike(tmp_path):
    """One record per status (and a member that failed, then finished on resume): the
    leaderboard's status column and ensemble.json's counts say the same."""
    import pandas as pd

    from ensemble.results.summary import finalize
    lines = [{"id": "a", "status": "failed", "error": {"kind": "lost_rank", "message": "gone"}},
             {"id": "a", "status": "ok", "val": {"accuracy": 0.7}, "test": {"accuracy": 0.6}},
             {"id": "b", "status": "ok", "val": {"accuracy": 0.9}, "test": {"accuracy": 0.8}},
             {"id": "c", "status": "ok", "val": {"accuracy": 0.99}, "discarded": {"epoch": 2, "rule": "asha"}},
             {"id": "d", "status": "discarded", "val": {"accuracy": 0.98}, "discarded": {"epoch": 4}},
             {"id": "e", "status": "failed", "error": {"kind": "nan_loss", "message": "NaN"}},
             {"id": "f", "status": "failed", "error": {"kind": "time_limit", "message": "slow"}},
             {"id": "g", "status": "stopped"}]
    run_dir = RunDirectory(tmp_path)
    summary = finalize(run_dir, [MemberRecord.from_json(x) for x in lines], config(metric="accuracy"),
                       {"task": "classification"}, np.zeros(2), np.zeros(2), ensemble=False, issued=9)
    assert summary["counts"] == {"ok": 2, "failed": 1, "discarded": 2, "stopped": 1, "limit": 1, "ended": 7,
                                 "issued": 9}
    assert (summary["n_finished"], summary["n_failed"], summary["n_discarded"]) == (2, 3, 2)
    board = pd.read_csv(tmp_path / "leaderboard.csv")
    assert list(board["id"]) == ["b", "a", "c", "d", "e", "f", "g"]
    assert board["status"].value_counts().to_dict() == {k: v for k, v in summary["counts"].items()
                                                        if k not in ("ended", "issued") and v}
    assert list(board["rank"].dropna()) == [1, 2] and board.loc[2, "discarded_at_epoch"] == 2
    assert json.loads((tmp_path / "ensemble.json").read_text())["counts"] == summary["counts"]
