"""``python -m ensemble.export RUN_DIR FILE.keras`` (``ensemble export``): a finished run's
ensemble as one Keras model, what ``python -m ensemble.predict RUN_DIR --export FILE.keras``
writes (its inputs and outputs: docs/predict.md)."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ensemble.export",
                                description="Write a finished run's ensemble as one Keras model: the members "
                                            "combined, averaged probabilities (classification) or [mean, "
                                            "variance] (regression).")
    p.add_argument("run_dir", help="run directory written by `python -m ensemble.run`")
    p.add_argument("out", metavar="FILE.keras", help="the model file to write")
    args = p.parse_args(argv)
    from ensemble.inference.export import export_ensemble
    from ensemble.inference.load import PredictError
    from ensemble.runtime.logs import setup_logging
    setup_logging(0)
    try:
        export_ensemble(args.run_dir, args.out)
    except PredictError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
