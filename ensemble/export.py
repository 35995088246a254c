"""``python -m ensemble.export RUN_DIR [OUT] [--format keras|saved_model|onnx]`` (``ensemble
export``): a finished run's ensemble as one model that takes raw features.

- ``keras`` (default): one ``.keras`` file of stock layers, the averaged probabilities
  (classification) or [mean, variance] (regression); what ``python -m ensemble.predict
  RUN_DIR --export FILE.keras`` writes (docs/predict.md);
- ``saved_model``: a TensorFlow SavedModel directory, for TF Serving and ``tf.saved_model.load``;
- ``onnx``: one ``.onnx`` file, for ONNX Runtime from Python, C, C++ or Fortran (the extra
  ``mpi-ensemble[onnx]``).

The last two hold the calibration too and name every output ``ensemble.predict`` gives
(docs/export.md). Without OUT the model goes into the run directory.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ensemble.results.rundir import RunDirectory

#: where each format goes without OUT, inside the run directory
DEFAULT_NAMES = RunDirectory.EXPORTS


def _format_of(out: str | None) -> str:
    """The format an OUT path implies: .onnx -> onnx, no suffix -> saved_model, else keras."""
    if out is None:
        return "keras"
    suffix = Path(out).suffix
    return "onnx" if suffix == ".onnx" else "saved_model" if not suffix else "keras"


#: other spellings of a format a user may give (``--format savedmodel``)
ALIASES = {"savedmodel": "saved_model", "tf": "saved_model", "tf_saved_model": "saved_model", "h5": "keras"}


def _format_name(value: str) -> str:
    name = value.strip().lower().replace("-", "_")
    return ALIASES.get(name, name)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ensemble.export",
                                description="Write a finished run's ensemble as one model that takes raw "
                                            "features: keras (averaged probabilities, or [mean, variance]), "
                                            "saved_model or onnx (every output of ensemble.predict, "
                                            "calibration included; see docs/export.md).")
    p.add_argument("run_dir", help="run directory written by `python -m ensemble.run`")
    p.add_argument("out", nargs="?", metavar="OUT",
                   help="the file (.keras, .onnx) or directory (SavedModel) to write; default: in RUN_DIR, "
                        + ", ".join(f"{f}: {n}" for f, n in DEFAULT_NAMES.items()))
    p.add_argument("--format", dest="fmt", choices=list(DEFAULT_NAMES), type=_format_name,
                   help="what to write (default: from OUT's suffix: .onnx onnx, none saved_model, else keras)")
    args = p.parse_intermixed_args(argv)            # OUT after --format too
    import os

    from ensemble.runtime.env import set_thread_env
    set_thread_env(os.cpu_count() or 1)             # and TensorFlow's import banners filtered, as predict's
    fmt = args.fmt or _format_of(args.out)
    out = args.out or str(Path(args.run_dir) / DEFAULT_NAMES[fmt])
    from ensemble.inference.export import export_model
    from ensemble.inference.load import PredictError
    from ensemble.runtime.logs import setup_logging
    setup_logging(0)
    try:
        export_model(args.run_dir, out, fmt)
    except PredictError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {out} ({fmt})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
