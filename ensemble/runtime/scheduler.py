"""The job's end, as the batch scheduler set it: the deadline a run must finish before.

A job script from ``python -m ensemble.jobscript`` exports ``ENSEMBLE_JOB_END_TIME`` (UNIX
seconds) from whatever its scheduler tells a job: Slurm's ``SLURM_JOB_END_TIME`` or
``squeue``, PBS's walltime from ``qstat``, LSF's run limit from ``bjobs``, Flux's ``flux job
timeleft``, else the script's own start plus the walltime it asked for. Only Slurm also
puts the end in every job's environment itself, so it is read too: a hand-written Slurm
script, or ``srun`` in an interactive allocation, gets the deadline without the variable.
Pure Python, so it is tested without a scheduler.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping


def job_end_time(environ: Mapping[str, str] = os.environ) -> float | None:
    """The job's end as a UNIX time, or None outside a job with a known end.

    A malformed ``ENSEMBLE_JOB_END_TIME`` raises ``ValueError``: it was set for this run, and
    ignoring it would let the scheduler kill the job before the ensemble is written. Slurm's
    variable is only skipped when it is not a positive number (an old or odd Slurm)."""
    value = environ.get("ENSEMBLE_JOB_END_TIME", "").strip()
    if value:
        try:
            end = float(value)
        except ValueError:
            end = math.nan
        if not (math.isfinite(end) and end > 0):
            raise ValueError(f"ENSEMBLE_JOB_END_TIME must be the job's end in UNIX seconds (as `date +%s` "
                             f"prints it), but got {value!r}; unset it to run without a deadline")
        return end
    try:
        end = float(environ.get("SLURM_JOB_END_TIME", ""))
    except ValueError:
        return None
    return end if math.isfinite(end) and end > 0 else None
