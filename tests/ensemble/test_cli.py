"""The one ``ensemble`` command: its subcommands, their help, the generated reference page."""

from __future__ import annotations

import functools
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ensemble import cli


def test_help_lists_every_subcommand(capsys):
    assert cli.main(["--help"]) == 0 and cli.main([]) == 0
    out = capsys.readouterr().out
    for name in ("run", "check", "status", "report", "predict", "export", "reselect", "jobscript", "simulate"):
        assert f"  {name} " in out


def test_an_unknown_subcommand_is_refused_with_the_list(capsys):
    assert cli.main(["trian", "c.toml"]) == 2
    err = capsys.readouterr().err
    assert "unknown command 'trian'" in err and "run, check, status" in err


@pytest.mark.parametrize("name", list(cli.COMMANDS))
def test_every_subcommand_has_help(name):
    text = cli.help_text(name)
    assert text.startswith("usage: ") and "-h, --help" in text


def test_a_subcommand_runs_its_module_with_the_same_arguments(tmp_path, capsys, own_logging):
    from ensemble import status
    missing = str(tmp_path / "no-run-here")
    code = cli.main(["status", missing])
    first = capsys.readouterr()
    assert code == status.main([missing]) != 0
    assert first == capsys.readouterr()                       # the same words, both ways


def test_check_has_its_own_arguments_and_runs_as_run_check_does(tmp_path, capsys):
    """``ensemble check --help`` is the check's own usage (it showed the run's), and ``ensemble
    check CONFIG`` reports as ``python -m ensemble.run CONFIG --check`` does."""
    from ensemble import run
    text = cli.help_text("check")
    assert text.startswith("usage: ensemble check") and "--overwrite" not in text and "--resume" in text
    config = tmp_path / "bad.toml"
    config.write_text('mode = "nonsense"\n')
    code = cli.main(["check", str(config)])
    first = capsys.readouterr().out
    assert code == run.main([str(config), "--check"]) == 2
    timeless = functools.partial(re.sub, r"\d+\.\d+ s\b", "T s")       # "read in 1.6 s"
    assert timeless(first) == timeless(capsys.readouterr().out) and "mode" in first


def test_the_reference_page_is_generated_from_the_parsers():
    assert cli.REFERENCE.read_text() == cli.reference(), \
        "docs/cli.md is stale: python -m ensemble.cli --reference --write"


def test_the_console_command_is_installed():
    exe = Path(sys.executable).parent / "ensemble"
    assert exe.is_file(), "the `ensemble` command is missing: make install (pip install -e .)"
    proc = subprocess.run([str(exe), "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "reselect" in proc.stdout


@pytest.fixture
def own_logging():
    """The subcommand configures the ``ensemble`` logger of this process: put it back after."""
    import logging
    logger = logging.getLogger("ensemble")
    handlers, level = list(logger.handlers), logger.level
    yield
    logger.handlers[:] = handlers
    logger.setLevel(level)


def test_export_of_a_missing_run_is_one_line(tmp_path, capsys, own_logging):
    assert cli.main(["export", str(tmp_path / "none"), str(tmp_path / "e.keras")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "does not exist" in err and len(err.strip().splitlines()) == 1


def test_bash_completion_offers_the_subcommands(capsys):
    import shutil
    assert cli.main(["completion"]) == 0
    script = capsys.readouterr().out
    assert "complete -o filenames -F _ensemble ensemble" in script
    bash = shutil.which("bash")
    if bash:                                   # the script runs in bash and completes "re" to both
        probe = script + '\nCOMP_WORDS=(ensemble re); COMP_CWORD=1; _ensemble; echo "${COMPREPLY[@]}"'
        out = subprocess.run([bash, "-c", probe], capture_output=True, text=True, timeout=30).stdout.split()
        assert sorted(out) == ["report", "reselect"]


def test_resume_and_overwrite_together_are_refused():
    """Both at once meant --resume, silently (or only the resume's error): they contradict."""
    from ensemble.run import parse_args
    with pytest.raises(SystemExit) as stop:
        parse_args(["x.toml", "--resume", "--overwrite"])
    assert stop.value.code == 2


@pytest.mark.parametrize("bad", [["--workers", "0"], ["--workers", "-3"], ["--workers", "4", "--members", "0"],
                                 ["--workers", "4", "--members", "-5"], ["--workers", "4", "--seconds", "-1"]])
def test_simulate_refuses_counts_and_seconds_that_are_not_positive(bad, capsys):
    """--workers 0 was a KeyError traceback, -3 an IndexError, --members 0 or -5 simulated other
    counts silently, --seconds -1 printed a utilisation of -226%."""
    from ensemble.simulate import parse_args
    with pytest.raises(SystemExit) as stop:
        parse_args(["configs/digits.toml", *bad])
    assert stop.value.code == 2 and "must be above 0" in capsys.readouterr().err


@pytest.mark.parametrize("bad, says", [(["--stop-quantile", "2"], "must be in [0, 1]"),
                                       (["--latency", "-1"], "must be at least 0"),
                                       (["--message-us", "-2"], "must be at least 0"),
                                       (["--time-limit", "0"], "must be above 0"),
                                       (["--members", "10", "--per-worker", "2"], "not allowed with")])
def test_simulate_refuses_settings_it_would_misread(bad, says, capsys):
    """--stop-quantile 2 was a ValueError traceback, --latency -1 a 99.9% utilisation, and
    --per-worker beside --members was ignored."""
    from ensemble.simulate import parse_args
    with pytest.raises(SystemExit) as stop:
        parse_args(["configs/digits.toml", "--workers", "4", *bad])
    assert stop.value.code == 2 and says in capsys.readouterr().err


def test_the_fast_engine_simulates_the_configs_own_members(capsys):
    from ensemble.simulate import main
    assert main(["configs/digits.toml", "--workers", "4", "--engine", "fast"]) == 0
    row = capsys.readouterr().out.splitlines()[-1].split()
    assert row[:2] == ["4", "8"]                          # 4 workers, the config's 8 members (4 MLPs + 4 CNNs)


def test_simulate_says_what_it_assumed_and_the_fast_engine_refuses_a_population(capsys):
    """A new user read "23% utilisation at 20,000 workers" of a PBT config as a forecast: the
    fast engine had modelled one-shot members (no rounds) and the master's cost was the
    ensemble mode's, unsaid."""
    from ensemble.simulate import main
    assert main(["configs/digits.toml", "--workers", "4", "--engine", "fast"]) == 0
    said = capsys.readouterr().out.splitlines()[0]
    assert said.startswith("assumed: members of made-up duration: log-normal, median")
    assert "the ensemble mode's measured model" in said and "message latency 0.5 ms one way" in said
    assert "helpers" not in said                          # none at 4 workers; at 64 said (10 members took 0.9 s)
    assert main(["configs/digits.toml", "--workers", "4", "64", "--engine", "fast"]) == 0
    assert "idle workers join the last members as helpers (`runtime.tail_helpers` 'auto': at 64 workers)" \
        in capsys.readouterr().out
    with pytest.raises(SystemExit, match="--engine fast models independent members .* mode 'pbt'"):
        main(["configs/digits_pbt.toml", "--workers", "4", "--engine", "fast"])
    from ensemble.orchestrate.simulate import cost_source
    assert cost_source("pbt") == "the ensemble mode's measured model (the pbt mode's master was not measured)"


def test_export_takes_other_spellings_of_a_format():
    """`--format savedmodel` was refused (the accepted name is saved_model)."""
    from ensemble.export import _format_name
    assert {_format_name(v) for v in ("savedmodel", "SavedModel", "saved-model", "tf")} == {"saved_model"}
    assert _format_name("ONNX") == "onnx" and _format_name("keras") == "keras"
