"""Ranking, top-k and greedy (Caruana) ensemble selection on known cases."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ensemble.results.records import MemberRecord
from ensemble.results.selection import (
    SIGNIFICANCE_Z,
    bagged_selection,
    choose_ensemble,
    effective_size,
    few_rows_note,
    greedy_selection,
    k_grid,
    rank_members,
    select,
    shrunk_selection,
    top_k,
)
from ensemble.task.metrics import average_predictions, score


def ensemble_score(weights: dict, preds: dict, y: np.ndarray, metric: str) -> float:
    stacked = np.stack([preds[i] for i in weights])
    return score(metric, y, average_predictions(stacked, np.array(list(weights.values()))))


def assert_weights(weights: dict) -> None:
    assert weights and all(w > 0 for w in weights.values())
    assert sum(weights.values()) == pytest.approx(1.0)
    values = list(weights.values())
    assert values == sorted(values, reverse=True)


@pytest.fixture(scope="module")
def regression_case():
    """Three good members whose errors cancel exactly, seven independent noisy ones
    that score between the good ones individually."""
    rng = np.random.default_rng(0)
    n = 300
    y = rng.normal(size=n)
    a, b = rng.normal(size=n), rng.normal(size=n)
    preds = {"g1": y + a, "g2": y + b, "g3": y - a - b}
    preds |= {f"n{j}": y + 1.2 * rng.normal(size=n) for j in range(7)}
    return y, preds


@pytest.fixture(scope="module")
def classification_case():
    """Three good members each confidently wrong on its own third of the samples
    (their average is right everywhere), seven noisy members that are individually
    better by log loss (wrong on a random quarter)."""
    rng = np.random.default_rng(1)
    n, c = 300, 3
    y = rng.integers(0, c, n)
    rows = np.arange(n)

    def member(wrong: np.ndarray, top: float, pred: np.ndarray) -> np.ndarray:
        p = np.full((n, c), (1 - top) / (c - 1))
        p[rows, np.where(wrong, pred, y)] = top
        return p

    preds = {f"g{i}": member(rows % 3 == i, 0.8, (y + 1) % c) for i in range(3)}
    for j in range(7):
        preds[f"n{j}"] = member(rng.random(n) < 0.25, 0.6, (y + 1 + rng.integers(0, 2, n)) % c)
    return y, preds


# ------------------------------------------------------------------------ ranking
def test_rank_members_direction_ties_and_missing_last():
    records = [
        {"id": "c", "val": {"accuracy": 0.8}},
        {"id": "e", "val": {"accuracy": float("nan")}},
        {"id": "b", "val": {"accuracy": 0.9}},
        {"id": "d", "val": {}},
        {"id": "a", "val": {"accuracy": 0.8}},
        {"id": "f"},  # failed member: no validation at all
        {"id": "g", "val": {"accuracy": 0.95, "log_loss": 0.1}},
    ]
    assert [r["id"] for r in rank_members(records, "accuracy")] == list("gbacdef")
    # lower is better for log_loss; everyone without it goes last, by id
    assert [r["id"] for r in rank_members(records, "log_loss")] == list("gabcdef")
    assert rank_members(records, "accuracy")[0] is records[6]


def test_rank_members_ranks_typed_records_alike():
    """Member records as the master and the readers hold them rank as their journal lines do."""
    lines = [{"id": "c", "status": "ok", "val": {"accuracy": 0.8}}, {"id": "e", "status": "failed"},
             {"id": "b", "status": "ok", "val": {"accuracy": 0.9}},
             {"id": "a", "status": "ok", "val": {"accuracy": 0.8}}]
    typed = [MemberRecord.from_json(x) for x in lines]
    assert [r.id for r in rank_members(typed, "accuracy")] == [r["id"] for r in rank_members(lines, "accuracy")] \
        == list("bace")
    assert rank_members(typed, "accuracy")[0] is typed[2]


def test_rank_members_integer_ids_sort_numerically():
    records = [{"id": i, "val": {"mse": 1.0}} for i in (10, 2, 33, 1)]
    assert [r["id"] for r in rank_members(records, "mse")] == [1, 2, 10, 33]


def test_rank_members_unknown_metric():
    with pytest.raises(ValueError, match=r"`metric` must be one of .*accuracy.*, but got 'f1'"):
        rank_members([{"id": "a", "val": {"f1": 1.0}}], "f1")


# -------------------------------------------------------------------------- top-k
def test_top_k():
    scores = {"a": 0.3, "b": 0.1, "c": math.nan, "d": 0.2, "e": 0.1}
    assert top_k(scores, 2, "mse") == {"b": 0.5, "e": 0.5}
    assert list(top_k(scores, 3, "accuracy")) == ["a", "d", "b"]
    everyone = top_k(scores, 50, "mse")
    assert list(everyone) == ["b", "e", "d", "a"]  # the NaN one is never chosen
    assert_weights(everyone)
    with pytest.raises(ValueError, match="`k` must be a positive integer"):
        top_k(scores, 0, "mse")
    with pytest.raises(ValueError, match="no candidate has a finite"):
        top_k({"a": math.nan}, 1, "mse")


# ------------------------------------------------------------------------- greedy
def test_greedy_finds_the_complementary_members(regression_case):
    y, preds = regression_case
    weights = greedy_selection(preds, y, "mse", n_init=2)
    assert set(weights) == {"g1", "g2", "g3"}
    assert all(w == pytest.approx(1 / 3) for w in weights.values())
    assert ensemble_score(weights, preds, y, "mse") == pytest.approx(0.0, abs=1e-20)


def test_greedy_beats_top_k_regression(regression_case):
    y, preds = regression_case
    weights = greedy_selection(preds, y, "mse")  # sorted init with the 3 best
    assert {"g1", "g2", "g3"} <= set(weights)
    assert_weights(weights)
    single = {i: score("mse", y, p) for i, p in preds.items()}
    best_k = top_k(single, 3, "mse")
    assert ensemble_score(weights, preds, y, "mse") < 0.5 * ensemble_score(best_k, preds, y, "mse")
    assert ensemble_score(weights, preds, y, "mse") < min(single.values())


def test_greedy_beats_top_k_classification(classification_case):
    y, preds = classification_case
    single = {i: score("log_loss", y, p) for i, p in preds.items()}
    best_k = top_k(single, 3, "log_loss")
    assert set(best_k).isdisjoint({"g0", "g1", "g2"})  # top-k misses the good ones
    weights = greedy_selection(preds, y, "log_loss", max_size=20, task="classification")
    assert_weights(weights)
    assert sum(weights.get(g, 0.0) for g in ("g0", "g1", "g2")) > 0.8
    greedy_loss = ensemble_score(weights, preds, y, "log_loss")
    assert greedy_loss < ensemble_score(best_k, preds, y, "log_loss") - 0.1
    assert ensemble_score(weights, preds, y, "accuracy") == 1.0


def test_greedy_max_size_caps_the_picks(classification_case):
    y, preds = classification_case
    weights = greedy_selection(preds, y, "log_loss", max_size=7, n_init=3)
    counts = [w * 7 for w in weights.values()]
    assert counts == pytest.approx([round(c) for c in counts]) and sum(counts) == pytest.approx(7)
    assert greedy_selection(preds, y, "log_loss", max_size=1) == {
        min(preds, key=lambda i: (score("log_loss", y, preds[i]), i)): 1.0
    }


def test_greedy_stops_without_strict_gain_and_breaks_ties_by_id():
    y = np.array([0.0, 1.0, 2.0])
    preds = {"b": y + 0.1, "a": y + 0.1, "c": y + 1.0}
    assert greedy_selection(preds, y, "mse", n_init=1) == {"a": 1.0}
    perfect = {"z": y.copy(), "y": y + 0.5}
    assert greedy_selection(perfect, y, "mse", n_init=1) == {"z": 1.0}


def test_greedy_is_deterministic_under_reordering(classification_case):
    y, preds = classification_case
    first = greedy_selection(preds, y, "brier", max_size=15)
    again = greedy_selection(dict(reversed(list(preds.items()))), y, "brier", max_size=15)
    assert first == again and list(first) == list(again)


def test_greedy_skips_members_with_broken_predictions(regression_case):
    y, preds = regression_case
    broken = dict(preds, bad=np.full_like(y, np.nan))
    assert "bad" not in greedy_selection(broken, y, "mae", max_size=10)


def test_greedy_nll_uses_the_mixture_variance():
    rng = np.random.default_rng(5)
    y = rng.normal(size=200)
    preds = {"calibrated": y + rng.normal(size=200), "overconfident": y + rng.normal(size=200)}
    variances = {"calibrated": np.ones(200), "overconfident": np.full(200, 0.01)}
    weights = greedy_selection(preds, y, "nll", n_init=1, val_vars=variances)
    assert next(iter(weights)) == "calibrated"
    assert_weights(weights)
    with pytest.raises(ValueError, match="needs the members' variances"):
        greedy_selection(preds, y, "nll")


def test_greedy_argument_errors(regression_case):
    y, preds = regression_case
    with pytest.raises(ValueError, match="`task` must be 'regression' for metric 'mse'"):
        greedy_selection(preds, y, "mse", task="classification")
    with pytest.raises(ValueError, match="`n_init` must be a positive integer"):
        greedy_selection(preds, y, "mse", n_init=0)
    with pytest.raises(ValueError, match="must share one shape"):
        greedy_selection(dict(preds, short=y[:5]), y, "mse")
    with pytest.raises(ValueError, match="at least one member"):
        greedy_selection({}, y, "mse")


# ------------------------------------------------------------------------- select
def test_select_defaults_to_greedy_when_more_candidates_than_k(regression_case):
    y, preds = regression_case
    assert select(preds, y, "mse", k=3) == greedy_selection(preds, y, "mse")
    assert select(preds, y, "mse", method="top_k", k=3) == top_k(
        {i: score("mse", y, p) for i, p in preds.items()}, 3, "mse"
    )
    everyone = select(preds, y, "mse", k=10)  # not more than k: top-k keeps all
    assert len(everyone) == 10 and all(w == pytest.approx(0.1) for w in everyone.values())
    with pytest.raises(ValueError, match="`method` must be one of greedy, top_k"):
        select(preds, y, "mse", method="stacking")


# ------------------------------------------------------- the run's default selection
def planted_pool(n: int = 600, c: int = 3, seed: int = 0):
    """Five honest members (about 85% right, calibrated-ish) and one poor member that is
    61% right and 98% sure of every answer."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, c, n)
    pool = {}
    for m in range(5):
        logits = 2.0 * np.eye(c)[y] + rng.normal(0.0, 1.0, (n, c))
        e = np.exp(logits - logits.max(axis=1, keepdims=True))
        pool[f"good-{m}"] = e / e.sum(axis=1, keepdims=True)
    guess = np.where(rng.random(n) < 0.61, y, (y + rng.integers(1, c, n)) % c)
    poor = np.full((n, c), 0.01)
    poor[np.arange(n), guess] = 0.98
    pool["poor"] = poor
    return pool, y


@pytest.mark.parametrize("method", ["auto", "greedy", "bagged"])
def test_proper_score_selection_leaves_a_poor_confident_member_out(method):
    pool, y = planted_pool()
    choice = choose_ensemble(pool, y, "log_loss", method=method, seed=1)
    assert "poor" not in choice["weights"]
    best = min(score("log_loss", y, p) for p in pool.values())
    assert choice["val_score"] <= best and choice["best_member"]["val_score"] == pytest.approx(best)
    assert choice["val_score"] == pytest.approx(ensemble_score(choice["weights"], pool, y, "log_loss"))
    assert 1.0 <= choice["effective_size"] <= len(choice["weights"]) + 1e-9
    assert sum(choice["weights"].values()) == pytest.approx(1.0)
    if method == "auto":
        assert set(choice["cv"]) == {*(f"top_{k}" for k in k_grid(len(pool))), "greedy", "bagged", "shrunk"}
        assert choice["method"] == "shrunk" and choice["single_member"] is None     # it shrinks toward the
        assert choice["why"] == "best out-of-fold score"                          # good members alone


def test_shrunk_selection_moves_bagged_weights_toward_the_uniform_average_of_the_competitive_members():
    """The members not clearly worse than the best on validation (``competitive``): all of a
    deep ensemble's, not a search's poor candidates (a poor confident member here)."""
    pool, y = planted_pool()
    bagged = bagged_selection(pool, y, "log_loss", seed=2)
    shrunk = shrunk_selection(pool, y, "log_loss", seed=2, shrink=0.25)
    good = [i for i in pool if i != "poor"]
    assert set(shrunk) == set(good) and sum(shrunk.values()) == pytest.approx(1.0)
    for i in good:
        assert shrunk[i] == pytest.approx(0.75 * bagged.get(i, 0.0) + 0.25 / len(good))
    alike = {i: pool[i] for i in good}                   # equally good members: every one in
    assert set(shrunk_selection(alike, y, "log_loss", seed=2)) == set(alike)
    assert shrunk_selection({"a": pool["good-0"], "b": pool["poor"]}, y, "log_loss", seed=2, shrink=1.0) == \
        {"a": pytest.approx(1.0)}
    assert shrunk_selection(pool, y, "log_loss", seed=2, shrink=0.0) == pytest.approx(bagged)
    # a search's pool: one good network, the others far worse. Bags without the good one gave them
    # nearly half the weight (reselect --method shrunk: validation log loss 0.44 against 0.29 alone)
    far = {"good-0": pool["good-0"], **{f"poor-{j}": pool["poor"] for j in range(4)}}
    assert set(bagged_selection(far, y, "log_loss", seed=2)) > {"good-0"}
    assert shrunk_selection(far, y, "log_loss", seed=2) == {"good-0": pytest.approx(1.0)}
    with pytest.raises(ValueError, match="shrink"):
        shrunk_selection(pool, y, "log_loss", shrink=1.5)


def test_explicit_methods_are_returned_as_asked_and_auto_keeps_a_clearly_better_member_alone():
    # one good member, two confidently wrong ones: every ensemble of two or more is worse
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 200)
    sure = np.eye(2)[y] * 0.9 + 0.05
    wrong = np.eye(2)[1 - y] * 0.8 + 0.1
    pool = {"a": sure, "b": wrong, "c": wrong.copy()}
    assert "b" in bagged_selection(pool, y, "log_loss") or "c" in bagged_selection(pool, y, "log_loss")
    bagged = choose_ensemble(pool, y, "log_loss", method="bagged")
    assert bagged["method"] == "bagged" and len(bagged["weights"]) > 1      # as asked, even when worse
    greedy = choose_ensemble(pool, y, "log_loss", method="greedy", n_init=3)
    assert greedy["weights"] == {"a": 1.0}                                  # initialisation stops at "a"
    top = choose_ensemble(pool, y, "log_loss", method="top_k", k=3)
    assert len(top["weights"]) == 3 and top["val_score"] > top["best_member"]["val_score"]
    assert top["why"] == "asked for"
    more = choose_ensemble(pool, y, "log_loss", method="top_k", k=10)     # reselect --k 10 of 3: said
    assert len(more["weights"]) == 3 and "k = 10, but only 3 candidate(s)" in more["why"]
    auto = choose_ensemble(pool, y, "log_loss")
    assert auto["weights"] == {"a": 1.0} and auto["single_member"]["z"] > SIGNIFICANCE_Z
    assert "standard errors" in auto["why"]
    assert auto["val_score"] == pytest.approx(score("log_loss", y, sure))


@pytest.mark.parametrize("metric", ["log_loss", "nll"])
def test_auto_never_keeps_one_member_when_all_are_equally_good(metric):
    """Members = the truth + independent noise of one size, small validation sets: the
    best member on validation is best by chance, and "auto" must average."""
    for seed in range(8):
        rng = np.random.default_rng(seed)
        n = int(rng.integers(25, 120))
        if metric == "log_loss":
            y = rng.integers(0, 3, n)
            pool = {}
            for m in range(8):
                logits = 1.5 * np.eye(3)[y] + rng.normal(0.0, 1.0, (n, 3))
                e = np.exp(logits - logits.max(axis=1, keepdims=True))
                pool[m] = e / e.sum(axis=1, keepdims=True)
            variances = None
        else:
            y = rng.normal(size=n)
            pool = {m: y + rng.normal(0.0, 0.5, n) for m in range(8)}
            variances = {m: np.full(n, 0.3) for m in range(8)}
        choice = choose_ensemble(pool, y, metric, val_vars=variances, seed=seed)
        assert len(choice["weights"]) > 1 and choice["single_member"] is None, (seed, choice["why"])


def test_auto_with_few_validation_rows_averages_the_k_best():
    pool, y = planted_pool(n=12)
    choice = choose_ensemble(pool, y, "log_loss", k=3)
    assert choice["method"] == "top_k" and len(choice["weights"]) == 3 and choice["cv"] is None
    assert "too few" in choice["why"]
    assert "12 row(s)" in few_rows_note(len(y)) and "data.val_fraction" in few_rows_note(len(y))


def test_few_rows_note_only_where_auto_cannot_cross_validate():
    pool, y = planted_pool(n=40)
    assert few_rows_note(len(y)) is None and choose_ensemble(pool, y, "log_loss", k=3)["cv"] is not None


def test_k_grid():
    assert k_grid(1) == [1] and k_grid(2) == [1, 2] and k_grid(8) == [1, 2, 3, 4, 5, 6, 8]
    grid = k_grid(500)
    assert grid[0] == 1 and grid[-1] == 500 and len(grid) < 30 and grid == sorted(set(grid))


def test_bagged_selection_is_seeded_and_spreads_weight():
    pool, y = planted_pool()
    a = bagged_selection(pool, y, "log_loss", seed=3)
    assert a == bagged_selection(dict(reversed(list(pool.items()))), y, "log_loss", seed=3)
    assert sum(a.values()) == pytest.approx(1.0)
    assert effective_size(a) >= effective_size(greedy_selection(pool, y, "log_loss")) - 1e-9


def test_effective_size():
    assert effective_size({"a": 1.0}) == pytest.approx(1.0)
    assert effective_size({i: 0.25 for i in "abcd"}) == pytest.approx(4.0)
    assert effective_size({"a": 0.93, "b": 0.03, "c": 0.02, "d": 0.02}) == pytest.approx(1.154, abs=1e-3)


def test_top_k_through_choose_ranks_by_the_metric_and_breaks_ties_by_the_proper_score():
    y = np.array([0, 1, 0, 1])
    timid = np.array([[0.6, 0.4], [0.4, 0.6], [0.6, 0.4], [0.4, 0.6]])
    sure = np.array([[0.9, 0.1], [0.1, 0.9], [0.9, 0.1], [0.1, 0.9]])
    pool = {"a": timid, "b": sure, "c": timid.copy()}           # all at accuracy 1.0
    choice = choose_ensemble(pool, y, "log_loss", method="top_k", rank_metric="accuracy", k=1)
    assert choice["weights"] == {"b": 1.0}


def test_ranking_ties_go_to_the_better_proper_score_then_the_id():
    records = [{"id": "m1", "val": {"accuracy": 1.0, "log_loss": 0.3}},
               {"id": "m0", "val": {"accuracy": 1.0, "log_loss": 0.3}},
               {"id": "m2", "val": {"accuracy": 1.0, "log_loss": 0.1}},
               {"id": "m3", "val": {"accuracy": 0.9, "log_loss": 0.01}}]
    assert [r["id"] for r in rank_members(records, "accuracy", "log_loss")] == ["m2", "m0", "m1", "m3"]
    assert [r["id"] for r in rank_members(records, "accuracy")] == ["m0", "m1", "m2", "m3"]


def test_the_console_warns_when_the_most_frequent_class_scores_the_ensembles_accuracy():
    from ensemble.results.summary import format_comparison
    test = {"accuracy": 0.9778, "log_loss": 0.09}
    summary = {"ensemble": {"test": test}, "best_member": {"id": "mlp-001", "test": test}, "metric": "accuracy",
               "members": [{"id": "mlp-001"}], "majority": {"class": "0", "test_accuracy": 0.9778}}
    text = format_comparison(summary)
    assert "warning: answering the most frequent class ('0') for every row scores test accuracy 0.9778" in text
    assert "with classes this imbalanced accuracy says little" in text
    summary["majority"]["test_accuracy"] = 0.6
    assert "most frequent class" not in format_comparison(summary)
    summary["ensemble"]["test"] = {"accuracy": 0.32, "log_loss": 1.1}        # balanced classes, nothing learnt
    summary["majority"]["test_accuracy"] = 0.37
    text = format_comparison(summary)
    assert "learnt nothing usable from the features" in text and "imbalanced" not in text


def test_several_regression_targets_get_their_own_test_metrics():
    from ensemble.results.summary import format_comparison, per_target_metrics
    cfg = {"target_names": ["temp", "flux"]}           # the run's meta (datafeed.prepare.prepare_targets)
    rng = np.random.default_rng(0)
    y = np.column_stack([rng.normal(size=50), 1000 * rng.normal(size=50)])      # flux: r2 0.99, temp 0.99 too
    mean = y + np.column_stack([0.1 * rng.normal(size=50), 100 * rng.normal(size=50)])
    got = per_target_metrics(cfg, {"mean": mean, "var": np.ones_like(mean)}, y)
    assert list(got) == ["temp", "flux"] and set(got["temp"]) == {"mse", "mae", "r2", "nll"}
    assert got["temp"]["mse"] == pytest.approx(np.mean((mean[:, 0] - y[:, 0]) ** 2))
    assert got["flux"]["mse"] > 1e5 * got["temp"]["mse"] and abs(got["flux"]["r2"] - got["temp"]["r2"]) < 0.01
    assert per_target_metrics(cfg, {"mean": mean[:, :1], "var": None}, y[:, :1]) is None
    test = {"mse": 1.0}
    text = format_comparison({"ensemble": {"test": test}, "best_member": {"id": "a", "test": test}, "metric": "mse",
                              "members": [{"id": "a"}], "per_target": got})
    assert "  target temp: test mse " in text and "  target flux: test mse " in text
    # each target's calibrated intervals: the pooled coverage hid one target's missing (0.84 pooled: 0.84 and 0.83)
    half = {"90": np.column_stack([np.full(50, 1e-9), np.full(50, 1e9)])}     # temp covers nothing, flux all
    got = per_target_metrics(cfg, {"mean": mean, "var": np.ones_like(mean), "intervals": half}, y)
    assert got["temp"]["coverage90"] == 0.0 and got["flux"]["coverage90"] == 1.0
    text = format_comparison({"ensemble": {"test": test}, "best_member": {"id": "a", "test": test}, "metric": "mse",
                              "members": [{"id": "a"}], "per_target": got})
    assert "   coverage 90% 0.00" in text and "   coverage 90% 1.00" in text


def test_the_console_says_how_much_a_conformal_interval_moves_with_its_calibration_rows():
    """A user saw calibrated intervals cover 0.83 of 120 test rows against 0.96 uncalibrated, on 60
    calibration rows, with nothing saying how far that goes by chance."""
    from ensemble.results.summary import format_comparison
    from ensemble.task.calibration import coverage_spread
    test = {"mse": 1.0, "nll": 1.5, "coverage50": 0.5, "coverage80": 0.8, "coverage90": 0.83, "coverage95": 0.9}
    summary = {"ensemble": {"test": test}, "best_member": {"id": "m", "test": test}, "metric": "mse",
               "members": [{"id": "m"}], "calibration": {"method": "conformal", "rows": 60}}
    assert "fitted on 60 validation rows" in format_comparison(summary)
    assert f"give or take {coverage_spread(0.9, 60):.2f}" in format_comparison(summary)
    assert 0.035 < coverage_spread(0.9, 60) < 0.04 and coverage_spread(0.9, 5000) < 0.005
    summary["calibration"]["method"] = "none"                      # it said "the none intervals"
    assert "test coverage of the uncalibrated intervals" in format_comparison(summary)


def test_the_console_says_when_no_member_stopped_early():
    """42 training rows, 30 epochs, batch 64: 30 gradient steps, every member ran them all, and the
    ensemble scored test mse 1927 against ridge's 141 with nothing saying why (400 epochs: 166)."""
    from ensemble.results.summary import format_comparison
    test = {"mse": 1927.0}
    summary = {"ensemble": {"test": test}, "best_member": {"id": "m", "test": test}, "metric": "mse",
               "members": [{"id": "m"}], "epochs_spent": {"members": 8, "epochs": 30}}
    assert ("note: every one of the 8 members ran all 30 epochs without stopping early"
            in format_comparison(summary)) and "raise `train.epochs`" in format_comparison(summary)
    summary["epochs_spent"] = {"members": 8, "epochs": 3, "patience": 5}        # it could never stop early
    assert "`train.epochs` is not more than `train.patience`" in format_comparison(summary)
    del summary["epochs_spent"]
    assert "stopping early" not in format_comparison(summary)


def test_the_console_names_a_one_member_ensemble_and_the_selections_own_best_member():
    """A one-member ensemble (cnn-004, best on validation log loss) beside "best member cnn-002" (best
    on accuracy), and the selection line quoting cnn-004's score as "best member": a reader took the
    ensemble for cnn-002 scoring worse than itself."""
    from ensemble.results.summary import format_comparison
    test = {"accuracy": 0.65, "log_loss": 0.9}
    best = {"id": "cnn-002", "test": {"accuracy": 0.67, "log_loss": 1.0}}
    summary = {"ensemble": {"test": test}, "best_member": best,
               "metric": "accuracy", "members": [{"id": "cnn-004"}],
               "selection": {"method": "top_k", "k": 1, "picks": 1, "metric": "log_loss", "val_score": 0.8,
                             "best_member": {"id": "cnn-004", "val_score": 0.8}, "effective_size": 1.0}}
    text = format_comparison(summary)
    assert "ensemble (1 member: cnn-004)" in text
    assert "(best single member on it: cnn-004 0.8000; the leaderboard's best, cnn-002, is best on accuracy)" in text


def test_the_leaderboard_columns_keep_one_order_whatever_order_records_hold_their_metrics():
    """A resumed run's records (read back from the journal) held their metrics in another order, and
    leaderboard.csv's columns moved: a script reading them by position broke."""
    from ensemble.results.summary import leaderboard
    fresh = {"id": "m-0", "status": "ok", "val": {"accuracy": 0.9, "log_loss": 0.3, "brier": 0.1, "ece": 0.02},
             "test": {"accuracy": 0.8, "log_loss": 0.4, "brier": 0.2, "ece": 0.03}}
    read_back = {"id": "m-1", "status": "ok", "val": dict(sorted(fresh["val"].items())),
                 "test": dict(sorted(fresh["test"].items()))}
    assert list(leaderboard([fresh], "accuracy").columns) == list(leaderboard([read_back], "accuracy").columns)
    assert [c for c in leaderboard([read_back], "accuracy").columns if c.startswith("val_")] == [
        "val_accuracy", "val_log_loss", "val_brier", "val_ece"]


def test_the_baseline_warning_counts_the_proper_score_too():
    """400 rows, 23 positives: the ensemble one row ahead on accuracy, the logistic regression nearly
    twice as good on log loss (0.1145 against 0.2125), and no warning."""
    from ensemble.results.summary import format_comparison
    ens, base = {"accuracy": 0.9667, "log_loss": 0.2125}, {"accuracy": 0.95, "log_loss": 0.1145}
    summary = {"task": "classification", "ensemble": {"test": ens}, "best_member": {"id": "m", "test": ens},
               "metric": "accuracy", "members": [{"id": "m"}, {"id": "n"}],
               "baseline": {"model": "logistic regression", "test": base}}
    text = format_comparison(summary)
    assert "beats the ensemble on test log_loss: baseline 0.1145, ensemble 0.2125" in text
    assert "accuracy: baseline" not in text
    summary["baseline"]["test"] = {"accuracy": 0.95, "log_loss": 0.3}
    assert "warning: the linear baseline" not in format_comparison(summary)


def test_selection_and_scores_do_not_depend_on_the_targets_offset_or_units():
    """A target of 1e9 + signal (a timestamp, a UTM coordinate): the mixture variance as
    E[var + mean^2] - mean^2 cancelled to 0, every validation NLL read ~1e10 and the weights were
    noise. A target of scale 1e-6: the absolute variance floor of 1e-12 floored every variance,
    and the NLL and coverage were the floor's. Both are now invariant to a shift (and the NLL
    shifts by log(scale) under a change of units)."""
    import math

    from ensemble.results.selection import choose_ensemble
    from ensemble.task.metrics import score
    rng = np.random.default_rng(0)
    n = 120
    truth = rng.normal(size=n)
    y = truth + 0.3 * rng.normal(size=n)
    noise = {f"m{i}": (0.05 + 0.1 * i) * rng.normal(size=n) for i in range(4)}
    var = {f"m{i}": np.full(n, 0.09 + 0.02 * i) for i in range(4)}
    chosen = {}
    for offset, scale in ((0.0, 1.0), (1e9, 1.0), (0.0, 1e-6)):
        preds = {i: offset + scale * (truth + e) for i, e in noise.items()}
        vars_ = {i: scale ** 2 * v for i, v in var.items()}
        out = choose_ensemble(preds, offset + scale * y, "nll", val_vars=vars_, seed=0)
        chosen[(offset, scale)] = out
        direct = score("nll", offset + scale * y, preds["m0"], vars_["m0"])
        assert direct == pytest.approx(score("nll", y, truth + noise["m0"], var["m0"]) + math.log(scale), abs=1e-6)
    base = chosen[(0.0, 1.0)]
    for key, out in chosen.items():
        assert out["weights"] == pytest.approx(base["weights"], abs=1e-9), key
        assert out["val_score"] == pytest.approx(base["val_score"] + math.log(key[1]), abs=1e-6), key
