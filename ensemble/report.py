"""``python -m ensemble.report RUN_DIR``: write (or rewrite) a run's ``report.html``.

Every run writes its report at the end; this command makes it again, e.g. after
``ensemble.reselect``, for a run stopped early, or while one is still going. It reads the
run directory only (``ensemble.results.report``) and needs neither MPI nor TensorFlow.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ensemble.report",
                                description="Write RUN_DIR/report.html: plots, tables and how the run was made, "
                                            "in one self-contained file.")
    p.add_argument("run_dir", help="the run directory (runs/<name>, or the run's --run-dir)")
    args = p.parse_args(argv)
    from ensemble.results.report import write_report
    try:
        path = write_report(args.run_dir)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {path} (plots also in {path.parent / 'report'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
