"""The run report from synthetic run directories (no MPI, no TensorFlow): every plot, the
page's tables, failures with their text, no external reference, and a plot that fails."""

from __future__ import annotations

import html
import json
import re
import warnings

import numpy as np
import pytest

from ensemble.config import dump_toml, resolve_config
from ensemble.results import report as R
from ensemble.results.rundir import RunDirectory


def _records(n: int, rng, task: str, evolve: bool) -> list[dict]:
    out, t = [], 1000.0
    for i in range(n):
        rank = 1 + i % 3
        start = t + i * 0.7
        if task == "classification":
            val = {"accuracy": float(rng.uniform(0.5, 0.99)), "log_loss": float(rng.uniform(0.05, 1.0))}
        else:
            val = {"mse": float(rng.uniform(1, 5)), "nll": float(rng.uniform(1, 3))}
        rec = {"id": f"m{i:03d}", "arch": "a", "status": "ok", "val": val,
               "test": {k: v * 1.01 for k, v in val.items()}, "params": int(rng.integers(500, 90000)),
               "train_seconds": float(rng.uniform(1, 3)), "rank": rank, "worker": rank - 1,
               "dispatched": start - 0.1, "started": start, "ended": start + 2.0, "received": start + 2.05}
        if evolve:
            rec["search"] = {"evaluation": i + 1, "wall": start - t, "fitness": val.get("accuracy")}
        out.append(rec)
    out[3] = {**out[3], "status": "failed", "error": {"kind": "nan_loss", "message": "loss became NaN at epoch 2"}}
    return out


def make_run(path, task="classification", evolve=False, finished=True, n=12):
    rng = np.random.default_rng(0)
    rd = RunDirectory(path)
    path.mkdir(parents=True)
    mode = "evolve" if evolve else "ensemble"
    raw = {"name": "synthetic", "mode": mode, "data": {"source": "digits"},
           "evolve": {"strategy": "nsga2", "objectives": "metric_params"}}
    if not evolve:
        raw["architectures"] = [{"name": "a", "members": n, "layers": [{"type": "Dense", "units": 8}]}]
    (path / rd.CONFIG).write_text(dump_toml(resolve_config(raw)))
    (path / rd.DATA).write_text(json.dumps({"task": task, "sizes": {"train": 80, "val": 20, "test": 60}}))
    records = _records(n, rng, task, evolve)
    opened = {"event": "open", "time": 999.0, "job_started": 996.0, "ranks": 4, "workers": 3, "group_size": 1,
              "host": "node1", "environment": {"argv": ["python", "-m", "ensemble.run", "c.toml"],
                                               "versions": {"python": "3.11", "MPI library": "MPICH 5"}}}
    lines = [opened, *records, {"event": "close", "time": 1020.0}]
    (path / rd.JOURNAL).write_text("".join(json.dumps(x) + "\n" for x in lines))
    if not finished:
        return path
    metric = "accuracy" if task == "classification" else "mse"
    ok = [r for r in records if r["status"] == "ok"]
    keys = list(ok[0]["val"])
    ens = {"val": {k: 0.9 for k in keys}, "test": {k: 0.91 for k in keys}}
    summary = {"task": task, "metric": metric, "method": "greedy",
               "members": [{"id": ok[0]["id"], "weight": 0.6}, {"id": ok[1]["id"], "weight": 0.4}],
               "n_finished": len(ok), "n_failed": 1, "ensemble": ens,
               "best_member": {"id": ok[0]["id"], "val": ok[0]["val"], "test": ok[0]["test"]},
               "baseline": {"model": "logistic regression", "train_rows": 80, "val": ens["val"],
                            "test": {k: 0.95 for k in keys}},
               "selection": {"method": "greedy", "metric": "log_loss", "val_score": 0.1, "picks": 2,
                             "best_member": {"id": ok[0]["id"], "val_score": 0.12}, "effective_size": 1.9,
                             "why": "best out-of-fold score", "single_member": None},
               "calibration": {"method": "none"},
               "run": {"utilisation": 0.8, "members": n}}
    (path / rd.ENSEMBLE).write_text(json.dumps(summary))
    m = 60
    if task == "classification":
        proba = rng.dirichlet(np.ones(3) * 0.5, size=m)
        y = np.array([rng.choice(3, p=p) for p in proba])
        rd.write_npz(rd.TEST_PREDICTIONS, y=y, proba=proba, best_proba=rng.dirichlet(np.ones(3), size=m))
    else:
        y = rng.normal(size=m)
        std = rng.uniform(0.2, 1.0, size=m)
        mean = y + rng.normal(size=m) * std
        rd.write_npz(rd.TEST_PREDICTIONS, y=y, mean=mean, std=std, lower_90=mean - 1.6 * std,
                     upper_90=mean + 1.6 * std)
    return path


def _images(page: str) -> int:
    return page.count("src='data:image/png;base64,")


@pytest.mark.slow                 # make test, not test-fast (its minute)
def test_classification_search_report_has_every_plot_and_no_external_reference(tmp_path):
    run = make_run(tmp_path / "run", "classification", evolve=True)
    out = R.write_report(run)
    page = out.read_text()
    want = {"leaderboard", "classification", "search", "costs", "timeline"}
    assert {p.stem for p in (run / "report").glob("*.png")} == want
    assert _images(page) == len(want) and "could not be drawn" not in page
    assert not re.search(r"(src|href)\s*=\s*['\"]?(https?:)?//", page)      # nothing fetched from anywhere
    assert "http://" not in page and "https://" not in page
    assert "loss became NaN at epoch 2" in page and "nan_loss" in page       # the failure, with its text
    assert "logistic regression" in page and "The linear baseline beats the ensemble" in page
    assert "on test accuracy: ensemble 0.9100, baseline 0.9500" in page     # each number named
    networks = page.split("<h2>Networks</h2>")[1].split("<h2>")[0]         # the architectures, as text
    assert "<th>network</th>" in networks and networks.count("<tr><td>") >= 2
    assert "<td>0.600</td>" in networks and "<td>0.400</td>" in networks    # the members' weights
    assert "MPICH 5" in page and "ensemble.run c.toml" in page               # how the run was made
    assert 'mode = &quot;evolve&quot;' in page                               # the config itself (escaped)


@pytest.mark.slow                 # make test, not test-fast (its minute)
def test_regression_report_has_intervals_and_spread_plots(tmp_path):
    run = make_run(tmp_path / "run", "regression")
    page = R.write_report(run).read_text()
    assert {p.stem for p in (run / "report").glob("*.png")} == {"leaderboard", "regression", "costs", "timeline"}
    assert "could not be drawn" not in page
    assert "The ensemble beats the linear baseline" in page                 # mse 0.91 < 0.95
    assert "on test mse: ensemble 0.9100, baseline 0.9500" in page
    summary = json.loads((run / "ensemble.json").read_text())         # conformal asked for, on unheld rows
    summary["calibration"].update(method="conformal", rows=23, held_out=False)
    (run / "ensemble.json").write_text(json.dumps(summary))
    assert "the intervals may cover less than nominal" in R.write_report(run).read_text()   # said only on the console
    validation = page.split("<h3>Validation split</h3>")[1]
    assert validation.index(html.escape(R.VALIDATION_CAVEAT)) < validation.index("<h2>")   # said under its table


def test_a_regression_of_several_targets_draws_a_row_per_target(tmp_path):
    """It drew the first target only ("first of 3 outputs")."""
    run = make_run(tmp_path / "run", "regression")
    rd = RunDirectory(run)
    rng = np.random.default_rng(1)
    y = rng.normal(size=(60, 3))
    std = rng.uniform(0.2, 1.0, size=(60, 3))
    mean = y + rng.normal(size=(60, 3)) * std
    rd.write_npz(rd.TEST_PREDICTIONS, y=y, mean=mean, std=std, lower_90=mean - 1.6 * std, upper_90=mean + 1.6 * std)
    data = json.loads((run / rd.DATA).read_text())
    (run / rd.DATA).write_text(json.dumps({**data, "target_names": ["temp", "flux", "rain"]}))
    fig = R.plot_regression(R.read_view(run))
    titles = [ax.get_title() for ax in fig.axes]
    assert len(fig.axes) == 6 and [t.split(":")[0] for t in titles[::2]] == ["target temp", "target flux",
                                                                             "target rain"]


def test_one_architectures_cost_plot_draws_no_empty_legend(tmp_path):
    """Members of one architecture share every cost: each panel is one column with no labelled
    points, and an empty legend() call warned on every such run's console."""
    run = make_run(tmp_path / "run", "classification")
    lines = (run / RunDirectory.JOURNAL).read_text().splitlines()
    same = [json.dumps({**r, "params": 4242, "train_seconds": 2.0}) if "params" in r else json.dumps(r)
            for r in map(json.loads, lines)]
    (run / RunDirectory.JOURNAL).write_text("".join(x + "\n" for x in same))
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="No artists with labels")
        fig = R.plot_costs(R.read_view(run))
    assert all(ax.get_legend() is None for ax in fig.axes)


def test_a_running_run_gets_a_partial_report(tmp_path):
    run = make_run(tmp_path / "run", finished=False)
    page = R.write_report(run).read_text()
    assert "No ensemble yet" in page and "could not be drawn" not in page
    assert {p.stem for p in (run / "report").glob("*.png")} == {"leaderboard", "costs", "timeline"}


def test_a_damaged_ensemble_json_is_said_with_the_fix_in_the_report_and_reselect(tmp_path):
    """ensemble.json cut short: the report said "no ensemble yet: the run has not finished", reselect
    raised a JSONDecodeError, predict gave no fix."""
    from ensemble.reselect import ReselectError, reselect
    run = make_run(tmp_path / "run")
    (run / "ensemble.json").write_text('{"metric": "accuracy", "memb')
    page = R.write_report(run).read_text()
    assert "ensemble.json cannot be read" in page and "--resume` writes it again" in page
    assert "No ensemble yet" not in page
    with pytest.raises(ReselectError, match=r"--resume` writes it again from the journal"):
        reselect(run, {})


def test_a_failing_plot_is_reported_on_the_page_not_raised(tmp_path, monkeypatch):
    run = make_run(tmp_path / "run")

    def broken(view):
        raise ValueError("no such axis")
    monkeypatch.setitem(R.PLOTS, "leaderboard", broken)
    page = R.write_report(run).read_text()
    assert "This plot could not be drawn: ValueError: no such axis" in page
    assert _images(page) == 3


def test_not_a_run_directory_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a run directory"):
        R.write_report(tmp_path)


def test_pareto_front_and_rank_correlation():
    cost = np.array([1.0, 2.0, 3.0, 4.0, 2.5])
    value = np.array([0.5, 0.7, 0.6, 0.9, 0.8])
    assert R.pareto_front(cost, value, higher=True).tolist() == [0, 1, 4, 3]
    assert R.pareto_front(cost, -value, higher=False).tolist() == [0, 1, 4, 3]
    assert R.spearman(np.arange(5.0), np.arange(5.0) ** 2) == pytest.approx(1.0)


def test_discarded_and_limited_members_are_counted_apart_and_never_plotted_as_results(tmp_path):
    """The header, the search plot and the failure table count by status: a discarded
    candidate is neither finished nor plotted as a result; a member stopped by its time
    limit (an older journal: failed with kind time_limit) is listed with the failures."""
    run = make_run(tmp_path / "run", "classification", evolve=True, finished=False)
    journal = run / RunDirectory.JOURNAL
    lines = [json.loads(x) for x in journal.read_text().splitlines()]
    lines[5] = {**lines[5], "discarded": {"epoch": 2, "rule": "asha"}}            # an older journal's discarded
    lines[6] = {**lines[6], "status": "discarded", "discarded": {"epoch": 2, "rule": "asha"}}
    lines[7] = {**lines[7], "status": "failed", "error": {"kind": "time_limit", "message": "over 60 s"}}
    lines[1:1] = [{"event": "issued", "id": f"m{i:03d}", "evaluation": i + 1} for i in range(12)]
    lines.insert(1, {"event": "issued", "id": "m099", "evaluation": 99})            # handed out, not back yet
    journal.write_text("".join(json.dumps(x) + "\n" for x in lines))
    view = R.read_view(run)
    c = view.counts
    assert (c.ok, c.failed, c.discarded, c.limit, c.issued) == (8, 1, 2, 1, 13)
    assert len(view.ranked()) == 8
    assert not {"m004", "m005"} & {r.id for r in view.ranked()}                  # never ranked nor plotted
    page = R.write_report(run).read_text()
    header = re.search(r"<p class='counts' data-counts='([^']*)'>([^<]*)", page)
    assert json.loads(header.group(1).replace("&quot;", '"')) == c.as_dict()
    assert "members: 8 finished, 1 failed, 2 discarded early, 1 stopped by their time limit of 13 handed out" \
        in header.group(2)
    assert "stopped by its time limit" in page and "over 60 s" in page           # in the failure table
    assert "could not be drawn" not in page


def test_run_figures_are_rows_not_json():
    from ensemble.results.report import _flat
    rows = _flat({"utilisation": 0.8, "ranks": {"workers": 3, "master": {"busy": 0.1}}, "levels": [0.5, 2]})
    assert rows == [["utilisation", 0.8], ["ranks.workers", 3], ["ranks.master.busy", 0.1], ["levels", "0.5, 2"]]


def test_the_report_says_the_runs_state_as_status_does(tmp_path):
    """A run stopped early said "run finished" in its report (the report looked only for
    ensemble.json), one whose every member failed "not finished"; now the state, its reason
    and what --resume would train are the ones ``ensemble.status`` gives."""
    from ensemble.results.heartbeat import Heartbeat
    run = make_run(tmp_path / "stopped")
    Heartbeat(run, 10.0, total=60, members_end_apart=True).final("stopped", reason="the run's time limit is near")
    head = R.write_report(run).read_text().split("<h2>")[0]
    assert "run <b class='state'>stopped early</b>: the run&#x27;s time limit is near; " in head
    assert "--resume" in head and "48 of 60 members not trained yet" in head and "run finished" not in head
    run = make_run(tmp_path / "failed", finished=False)
    Heartbeat(run, 10.0).final("failed", error="no member finished (0 finished, 12 failed)")
    head = R.write_report(run).read_text().split("<h2>")[0]
    assert "run <b class='state'>failed</b>: no member finished (0 finished, 12 failed)" in head
    run = make_run(tmp_path / "done")
    Heartbeat(run, 10.0).final("done")
    assert "run <b class='state'>done</b>." in R.write_report(run).read_text()


def test_the_report_judges_the_baseline_as_the_console_does(tmp_path):
    """A tie on accuracy was "The ensemble beats the linear baseline" in the report, while the
    console warned that the baseline beat it on log loss."""
    from ensemble.results.summary import format_comparison
    run = make_run(tmp_path / "run")
    summary = json.loads((run / "ensemble.json").read_text())
    summary["baseline"]["test"] = {**summary["ensemble"]["test"], "log_loss": 0.5}     # ties on accuracy
    (run / "ensemble.json").write_text(json.dumps(summary))
    page = R.write_report(run).read_text()
    assert "The linear baseline beats the ensemble</b> on test log_loss: ensemble 0.9100, baseline 0.5000" in page
    assert "beats the ensemble on test log_loss" in format_comparison(summary)
    summary["baseline"]["test"]["log_loss"] = 0.91                                    # a tie on both
    (run / "ensemble.json").write_text(json.dumps(summary))
    page = R.write_report(run).read_text()
    assert "The ensemble is at least as good as the linear baseline</b> on test accuracy" in page
    assert "beats" not in format_comparison(summary)


def test_a_report_of_several_targets_has_each_ones_metrics(tmp_path):
    """The console and ensemble.json gave per-target metrics; the report had none."""
    run = make_run(tmp_path / "run", "regression")
    summary = json.loads((run / "ensemble.json").read_text())
    summary["per_target"] = {"energy": {"mse": 2.5e6, "r2": 0.91, "coverage90": 0.9}, "gap": {"mse": 0.012, "r2": 0.8}}
    (run / "ensemble.json").write_text(json.dumps(summary))
    page = R.write_report(run).read_text()
    table = page.split("<h3>Each target (test split, its own units)</h3>")[1].split("</table>")[0]
    assert "<td>energy</td><td>2.5e+06</td><td>0.9100</td><td>0.9000</td>" in table
    assert "<td>gap</td><td>0.0120</td><td>0.8000</td><td></td>" in table
