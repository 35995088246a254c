"""Logging: rank 0 prints progress to stdout and problems to stderr; other ranks stay quiet;
a per-rank debug file takes everything when asked."""

from __future__ import annotations

import logging

from ensemble.runtime.logs import add_debug_file, setup_logging


def test_rank0_routes_by_level_and_workers_are_quiet(capsys):
    log = logging.getLogger("ensemble.some.module")
    setup_logging(0)
    log.debug("not shown at info")
    log.info("progress line")
    log.warning("stopped early")
    out, err = capsys.readouterr()
    assert out == "progress line\n" and err == "stopped early\n"
    setup_logging(3)
    log.error("a worker's error")
    assert capsys.readouterr() == ("", "")
    setup_logging(0, "warning")
    log.info("hidden")
    log.error("shown")
    assert capsys.readouterr() == ("", "shown\n")


def test_debug_file_per_rank(tmp_path, capsys):
    setup_logging(2)
    path = add_debug_file(tmp_path, 2)
    try:
        logging.getLogger("ensemble.train.member").debug("built model m0")
    finally:
        root = logging.getLogger("ensemble")
        for h in [h for h in root.handlers if isinstance(h, logging.FileHandler)]:
            h.close()
            root.removeHandler(h)
    assert path == tmp_path / "logs" / "rank-2.log"
    text = path.read_text()
    assert "rank 2 ensemble.train.member DEBUG: built model m0" in text
    assert capsys.readouterr() == ("", "")
