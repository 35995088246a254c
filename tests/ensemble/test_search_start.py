"""Where a search starts (``evolve.templates``, ``evolve.start_from``), without MPI: the real
SearchSource driven by hand, members "trained" at once to a metric that depends on the genome
only. The first candidates are the templates for the input's kind, or an earlier run's best
genomes then the templates; a bad ``start_from`` is one clear line, from the source and from
the config check; a search started from an earlier run resumes with every candidate once."""

from __future__ import annotations

import json
import logging
import textwrap
import time
import zlib

import pytest

from ensemble.config import ConfigError, Problems, dump_toml, resolve_config
from ensemble.modes.evolve import EvolveMode
from ensemble.results.journal import read_lines
from ensemble.results.journal import typed_history as history_of
from ensemble.results.records import MemberRecord
from ensemble.results.rundir import RunDirectory
from ensemble.sources.base import Hooks
from ensemble.sources.search import SearchSource, search_space
from evolve import genome_from_dict, templates
from evolve.templates import templates_for

META = {"task": "classification", "input_shape": [8, 8, 1], "n_outputs": 10}
SEARCH = {"filters": [4, 16], "units": [8, 32], "max_params": 20_000}


def config(space: str = "structured", evaluations: int = 10, **evolve) -> object:
    return resolve_config({"mode": "evolve", "seed": 7, "search": {**SEARCH, "space": space},
                           "evolve": {"evaluations": evaluations, "population_size": 4, "sample_size": 2, **evolve}})


def outcome(spec: dict) -> dict:
    """A member's record: its metric a pure function of its genome."""
    h = zlib.crc32(json.dumps(spec["genome"], sort_keys=True).encode())
    return {"id": spec["id"], "genome": spec["genome"], "summary": spec["summary"], "seed": spec["seed"],
            "params": 100, "seconds": 1.0, "status": "ok", "val": {"accuracy": (h % 1000) / 1000},
            "test": {"accuracy": 0.5}}


def drive(source: SearchSource, lines: list[dict], kill_after: int | None = None, in_hand: int = 2) -> None:
    """Hand out up to ``in_hand`` candidates, finish the oldest, again, until done; journal lines to
    ``lines`` as the master does; ``kill_after`` results: stop with the others still out."""
    source.bind(Hooks(event=lines.append, answer=lambda spec_id, decision: None, deadline=lambda: None,
                      clock=time.time))
    out: list[dict] = []
    finished = 0
    while True:
        while len(out) < in_hand and (spec := source.next_spec()) is not None:
            out.append(spec)
        if not out or finished == kill_after:
            return
        record = source.tell(MemberRecord.from_json(outcome(out.pop(0))))
        lines.append(json.loads(json.dumps(record.to_json())))
        finished += 1


def write_run(path, cfg, lines: list[dict], meta: dict = META):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.toml").write_text(dump_toml(cfg))
    (path / "data.json").write_text(json.dumps(meta))
    (path / "journal.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


@pytest.fixture
def earlier(tmp_path):
    """A finished structured search of 10 candidates on META's data."""
    cfg = config()
    lines: list[dict] = []
    drive(SearchSource(cfg, META, RunDirectory(tmp_path / "earlier"), []), lines)
    return write_run(tmp_path / "earlier", cfg, lines)


def issued_genomes(lines: list[dict]) -> list[dict]:
    return [x["genome"] for x in lines if x.get("event") == "issued"]


def test_the_first_candidates_are_the_templates_for_the_input(tmp_path):
    for space in ("structured", "free"):
        lines: list[dict] = []
        source = SearchSource(config(space), META, RunDirectory(tmp_path / space), [])
        drive(source, lines)
        made = [g.to_dict() for g in templates(search_space(config(space), META), (8, 8, 1), 10)]
        assert len(made) == len(templates_for((8, 8, 1))) and issued_genomes(lines)[:len(made)] == made
        assert len({json.dumps(g, sort_keys=True) for g in issued_genomes(lines)}) == 10
    lines = []
    drive(SearchSource(config(templates=False), META, RunDirectory(tmp_path / "none"), []), lines)
    assert not {json.dumps(g, sort_keys=True) for g in issued_genomes(lines)} & {
        json.dumps(g.to_dict(), sort_keys=True) for g in templates(search_space(config(), META), (8, 8, 1), 10)}


def test_a_search_starts_from_an_earlier_runs_best_genomes(tmp_path, earlier, caplog):
    records = [x for x in read_lines(earlier / "journal.jsonl") if "event" not in x]
    best = sorted(records, key=lambda x: (-x["val"]["accuracy"], x["id"]))
    lines: list[dict] = []
    caplog.set_level(logging.INFO)
    source = SearchSource(config(start_from=str(earlier)), META, RunDirectory(tmp_path / "next"), [])
    drive(source, lines)
    first = issued_genomes(lines)
    starts = [r["genome"] for r in best][:2]                   # half the first population of 4
    assert first[:2] == starts
    # and the log says which they are (it said nothing: a user could only tell from the genomes)
    assert (f"starts from 2 genome(s) of {earlier} (`evolve.start_from`: its {best[0]['id']}, {best[1]['id']}, "
            "here e0001-e0002)") in caplog.text
    # then nothing the earlier run trained (its templates, its random genomes: the same seed drew them)
    trained = {json.dumps(r["genome"], sort_keys=True) for r in records}
    assert not {json.dumps(g, sort_keys=True) for g in first[2:]} & trained
    assert len({json.dumps(g, sort_keys=True) for g in first}) == len(first) == 10
    again: list[dict] = []                 # the same without start_from: the earlier run's own first asks
    drive(SearchSource(config(), META, RunDirectory(tmp_path / "again"), []), again)
    assert issued_genomes(again)[:4] == [r["genome"] for r in records][:4]


def test_the_start_from_a_free_search_is_repaired_into_a_free_space(tmp_path):
    lines: list[dict] = []
    drive(SearchSource(config("free"), META, RunDirectory(tmp_path / "free"), []), lines)
    run = write_run(tmp_path / "free", config("free"), lines)
    cfg = config("free", start_from=str(run), templates=False)
    out: list[dict] = []
    drive(SearchSource(cfg, META, RunDirectory(tmp_path / "next"), []), out, kill_after=0)
    assert all(g in issued_genomes(lines) for g in issued_genomes(out))
    with pytest.raises(ConfigError, match=r"none of its 10 finished candidates fits this search space \(it "
                                          r"searched `search.space` 'free', this run 'structured'\)"):
        SearchSource(config(start_from=str(run)), META, RunDirectory(tmp_path / "other"), [])


def bad_runs(tmp_path, earlier) -> dict[str, tuple[str, str]]:
    """A wrong `start_from`: (the directory, what its error says)."""
    cfg = config()
    ensemble_cfg = resolve_config({"mode": "ensemble", "architectures": [{"layers": [{"type": "Dense", "units": 4}]}]})
    (tmp_path / "plain").mkdir()
    return {"missing": (str(tmp_path / "nowhere"), "does not exist"),
            "not a run": (str(tmp_path / "plain"), "is not a run directory"),
            "ensemble": (str(write_run(tmp_path / "ens", ensemble_cfg, [])), "is a mode 'ensemble' run"),
            "shape": (str(write_run(tmp_path / "shape", cfg, read_lines(earlier / "journal.jsonl"),
                                    {**META, "input_shape": [64]})),
                      "searched samples of shape [64], but this run's samples have shape [8, 8, 1]"),
            "task": (str(write_run(tmp_path / "task", cfg, read_lines(earlier / "journal.jsonl"),
                                   {**META, "task": "regression" if META["task"] == "classification" else
                                    "classification"})), "task, but this run is " + META["task"]),
            "empty": (str(write_run(tmp_path / "empty", cfg, [])), "has no finished candidates yet")}


@pytest.mark.parametrize("case", ["missing", "not a run", "ensemble", "shape", "task", "empty"])
def test_a_bad_start_from_is_one_line_naming_the_setting(tmp_path, earlier, case):
    run, says = bad_runs(tmp_path, earlier)[case]
    cfg = config(start_from=run)
    with pytest.raises(ConfigError) as info:
        SearchSource(cfg, META, RunDirectory(tmp_path / "next"), [])
    message = str(info.value)
    assert message.startswith(f"`evolve.start_from` {run!r}") and says in message and "\n" not in message
    found = Problems()
    EvolveMode().preflight(cfg, META, None, found)                # what `--check` reports
    assert found.messages == [message] and not found.ok("evolve.start_from")


def test_the_config_check_reports_a_bad_start_from_relative_to_the_config(tmp_path, capsys):
    from ensemble.orchestrate.check import check_main
    (tmp_path / "old").mkdir()
    path = tmp_path / "c.toml"
    path.write_text(textwrap.dedent("""
        mode = "evolve"
        [data]
        reshape = [8, 8, 1]
        [evolve]
        evaluations = 4
        start_from = "old"
        [search]
        space = "structured"
        filters = [4, 8]
        units = [8, 16]
        max_params = 20000
    """))
    assert check_main(str(path)) != 0
    out = capsys.readouterr().out
    assert f"`evolve.start_from` {str(tmp_path / 'old')!r} is not a run directory" in out
    assert "structured: 1..3 stages of 1..3 conv blocks" in out and "  genome 5: in 8x8x1: C" in out


@pytest.mark.parametrize("kill_after", [1, 3, 6])
def test_a_search_started_from_an_earlier_run_resumes_with_every_candidate_once(tmp_path, earlier, kill_after):
    cfg = config(start_from=str(earlier))
    full: list[dict] = []
    drive(SearchSource(cfg, META, RunDirectory(tmp_path / "full"), []), full)
    lines: list[dict] = []
    drive(SearchSource(cfg, META, RunDirectory(tmp_path / "killed"), []), lines, kill_after=kill_after)
    resumed = SearchSource(cfg, META, RunDirectory(tmp_path / "killed"), history_of(lines))
    drive(resumed, lines)
    records = [x for x in lines if "event" not in x]
    assert [x["id"] for x in records] == sorted(x["id"] for x in records)
    assert len({x["id"] for x in records}) == len(records) == 10            # every candidate once
    keys = [genome_from_dict(x["genome"]).key() for x in records]
    assert len(set(keys)) == 10
    assert [x["genome"] for x in records] == [x["genome"] for x in full if "event" not in x]


@pytest.mark.parametrize("then", ["moved", "continued"])
def test_a_resume_takes_the_starting_points_the_run_kept_whatever_became_of_the_earlier_run(tmp_path, earlier,
                                                                                           then, caplog):
    """The earlier run moved or purged (a scratch file system), or continued with better
    candidates since: the resumed search starts from what the run took when it began
    (``started_from.json``), and asks what the uninterrupted search asked. Before, a moved run
    blocked the resume in preflight, and a continued one changed the replayed first asks."""
    import shutil
    cfg = config(start_from=str(earlier))
    full: list[dict] = []
    drive(SearchSource(cfg, META, RunDirectory(tmp_path / "full"), []), full)
    lines: list[dict] = []
    killed = RunDirectory(tmp_path / "killed")
    drive(SearchSource(cfg, META, killed, []), lines, kill_after=3)
    kept = json.loads((killed.path / killed.STARTED_FROM).read_text())["evolve.start_from"]
    assert kept["path"] == str(earlier) and len(kept["value"]["genomes"]) == 2
    if then == "moved":
        shutil.rmtree(earlier)
        with pytest.raises(ConfigError, match="does not exist"):               # a new search: refused
            SearchSource(cfg, META, RunDirectory(tmp_path / "new"), [])
    else:                                  # a better candidate than any the run started from
        better = {**outcome({"id": "e0099", "genome": full[-1]["genome"], "summary": "", "seed": 1}),
                  "val": {"accuracy": 2.0}}
        with open(earlier / "journal.jsonl", "a") as f:
            f.write(json.dumps(better) + "\n")
    found = Problems()                     # what the resume's preflight (and `check --resume`) says
    EvolveMode().preflight(cfg, META, None, found, killed)
    assert not found.messages
    resumed = SearchSource(cfg, META, killed, history_of(lines))
    assert "goes on without" not in caplog.text and "may take another path" not in caplog.text
    drive(resumed, lines)
    records = [x for x in lines if "event" not in x]
    assert [x["genome"] for x in records] == [x["genome"] for x in full if "event" not in x]


def test_a_run_that_kept_no_starting_points_resumes_without_its_gone_earlier_run(tmp_path, earlier, caplog):
    """A run made before ``started_from.json``: its earlier run gone, it goes on without them."""
    import shutil
    cfg = config(start_from=str(earlier))
    lines: list[dict] = []
    killed = RunDirectory(tmp_path / "killed")
    drive(SearchSource(cfg, META, killed, []), lines, kill_after=3)
    (killed.path / killed.STARTED_FROM).unlink()
    shutil.rmtree(earlier)
    found = Problems()
    EvolveMode().preflight(cfg, META, None, found, killed)
    assert found.messages and "does not exist" in found.messages[0]
    resumed = SearchSource(cfg, META, killed, history_of(lines))
    assert "the search goes on without the starting points" in caplog.text
    drive(resumed, lines)
    records = [x for x in lines if "event" not in x]
    assert len({x["id"] for x in records}) == len(records) == 10
    assert len({genome_from_dict(x["genome"]).key() for x in records}) == 10


def test_a_run_records_its_space_and_an_older_run_without_one_resumes_in_the_free_space(tmp_path):
    """A new config writes `search.space = "auto"` into the run's config, so a resume resolves the
    space it started with; a run written before "auto" was the default (no `space` in its saved
    `[search]`) searched the free genome, and its journal holds free genomes: it resumes in "free"."""
    from ensemble.config import read_saved_config
    new = resolve_config({"mode": "evolve", "evolve": {"evaluations": 4}})
    assert new.search["space"] == "auto"
    assert search_space(new, META).structured                       # 8x8x1 images: structured
    (tmp_path / "config.toml").write_text(dump_toml({**new.to_dict(), "search": {}}))
    old = read_saved_config(tmp_path / "config.toml")
    assert old.search["space"] == "free" and not search_space(old, META).structured
    (tmp_path / "config.toml").write_text(dump_toml(new.to_dict()))
    assert read_saved_config(tmp_path / "config.toml").search["space"] == "auto"


def test_the_config_line_notes_a_budget_within_the_first_population_and_no_empty_settings():
    few = EvolveMode().describe(config(evaluations=4))           # a first population of 4
    assert "4 evaluations breed nothing" in few and "raise `evolve.evaluations` above 4" in few
    assert "start_from" not in few and "breed nothing" not in EvolveMode().describe(config(evaluations=10))


def test_the_console_says_whether_the_best_was_bred(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    for evaluations, said in ((4, "the search ended within its first population (4 of 4)"),
                              (10, "search: best")):
        lines: list[dict] = []
        (tmp_path / str(evaluations)).mkdir()
        source = SearchSource(config(evaluations=evaluations), META, RunDirectory(tmp_path / str(evaluations)), [])
        drive(source, lines)
        caplog.clear()
        out = source.finish([MemberRecord.from_json(x) for x in lines if "event" not in x])
        text = caplog.text
        assert "search: best of the first population (4)" in text and said in text
        bred = int(out["search"]["search_best"]["id"][1:]) > 4
        assert ("best evolved after" in text) == bred
    # ended within the first population by something else than `evolve.evaluations`: said, not
    # "raise `evolve.evaluations`" (a user's 200 evaluations were cut by `evolve.time_limit = 1`)
    for name, evolve, said in (("time", {"time_limit": 60.0}, "`evolve.time_limit` (60 s) ended it first"),
                               ("stop", {}, "the run ended before the search's budget")):
        lines = []
        (tmp_path / name).mkdir()
        source = SearchSource(config(evaluations=200, **evolve), META, RunDirectory(tmp_path / name), [])
        drive(source, lines, kill_after=2)
        source.strategy.continue_clock(100.0)                  # its clock past the time limit, if any
        caplog.clear()
        source.finish([MemberRecord.from_json(x) for x in lines if "event" not in x])
        assert said in caplog.text and "raise `evolve.evaluations`" not in caplog.text


def test_starting_from_a_run_with_another_split_of_the_same_data_is_said(tmp_path):
    import numpy as np

    from ensemble.orchestrate.prepare import split_leak_note
    data = {"source": str(tmp_path / "table.csv"), "label": "y"}
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    (earlier / "config.toml").write_text(dump_toml(resolve_config({"mode": "evolve", "seed": 1, "data": data})))
    rows = np.random.default_rng(1).permutation(100)
    np.savez(earlier / "splits.npz", train=np.sort(rows[:70]), val=np.sort(rows[70:85]), test=np.sort(rows[85:]))
    cfg = resolve_config({"mode": "evolve", "seed": 2, "data": data, "evolve": {"start_from": str(earlier)}})
    other = np.random.default_rng(2).permutation(100)
    mine = {"train": np.sort(other[:70]), "val": np.sort(other[70:85]), "test": np.sort(other[85:])}
    shared = int(np.isin(mine["test"], rows[:85]).sum())
    note = split_leak_note(cfg, mine)
    assert shared > 0 and f"{shared} of this run's 15 test rows were its training or validation rows" in note
    same = {"train": np.sort(rows[:70]), "val": np.sort(rows[70:85]), "test": np.sort(rows[85:])}
    assert split_leak_note(cfg, same) is None                                      # the same split: fine
    elsewhere = resolve_config({"mode": "evolve", "data": {**data, "source": str(tmp_path / "other.csv")},
                                "evolve": {"start_from": str(earlier)}})
    assert split_leak_note(elsewhere, mine) is None                                # other data: not comparable
    assert split_leak_note(resolve_config({"mode": "evolve", "data": data}), mine) is None


def test_a_search_key_the_genome_does_not_read_is_said():
    """`search.max_depth = 4` in an image search (the demo's config) shaped nothing: the structured
    genome reads stages and blocks; said by check and the run (``Mode.notes``)."""
    notes = EvolveMode().notes(resolve_config({"mode": "evolve", "search": {"max_depth": 4}}), META)
    assert len(notes) == 1 and notes[0].startswith("`search.max_depth` is not read: the search's genome is structured")
    assert "`search.stages` x `search.blocks`" in notes[0]
    flat = {**META, "input_shape": [10]}
    notes = EvolveMode().notes(resolve_config({"mode": "evolve", "search": {"stages": [1, 2], "blocks": [1, 2]}}),
                               flat)
    assert notes[0].startswith("`search.stages`, `search.blocks` are not read: the search's genome is the free")
    assert EvolveMode().notes(config(), META) == [] and EvolveMode().notes(config("free"), META) == []


def test_a_resume_compares_no_path_of_an_earlier_run_it_kept(tmp_path, earlier):
    """`start_from = "runs/base"` (relative, as the docs write it) is saved absolute while the earlier
    run exists; moved away, the relative path stays as written and --resume said "the config
    differs". The run kept what it took (started_from.json), so where it was is no part of the run."""
    from ensemble.orchestrate.prepare import config_differences
    run = RunDirectory(tmp_path / "next")
    cfg = config(start_from=str(earlier))
    write_run(run.path, cfg, [])
    moved = config(start_from="runs/base")
    assert "`evolve.start_from`" in config_differences(moved, run)              # nothing kept: it differs
    SearchSource(cfg, META, run, [])                                            # keeps started_from.json
    assert config_differences(moved, run) is None
    assert "`evolve.evaluations`" in config_differences(config(evaluations=11, start_from="x"), run)
