#!/bin/bash
# Example Slurm job: one rank per GPU, the master on the first rank.
# Submit:  sbatch scripts/slurm_ensemble.sh my.toml
# Untested here (no Slurm on the development machine); adapt the module lines to your site.
#SBATCH --job-name=ensemble
#SBATCH --nodes=4
#SBATCH --ntasks-per-node=4          # = GPUs per node (rank 0, the master, trains nothing: its GPU idles)
#SBATCH --gpus-per-node=4
#SBATCH --time=02:00:00
#SBATCH --output=%x-%j.out
set -euo pipefail
CONFIG=${1:?usage: sbatch scripts/slurm_ensemble.sh CONFIG.toml}

# module load cray-mpich cudatoolkit     # the site's MPI; mpi4py built against it (see README)
source .venv/bin/activate

# The master stops handing out members in time to write the leaderboard and ensemble
# before the job's end: it reads SLURM_JOB_END_TIME when Slurm sets it; otherwise set
# [runtime] time_limit in the config. A killed or timed-out job continues with --resume.
export SLURM_JOB_END_TIME=${SLURM_JOB_END_TIME:-$(squeue -h -j "$SLURM_JOB_ID" -o %e \
    | xargs -I{} date -d {} +%s 2>/dev/null || true)}

srun --cpu-bind=cores python -m ensemble.run "$CONFIG" "${@:2}"
