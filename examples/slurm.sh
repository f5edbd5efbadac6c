#!/bin/bash
#SBATCH --job-name=nlq
#SBATCH --nodes=4
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=32
#SBATCH --time=48:00:00
head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
srun torchrun --nnodes="$SLURM_NNODES" --nproc_per_node=8 --rdzv_backend=c10d \
    --rdzv_endpoint="$head:29500" --rdzv_id="$SLURM_JOB_ID" \
    -m nlq train --data /shared/data/owt --out "/shared/runs/$SLURM_JOB_NAME" --resume \
    --preset gpt3-small --model.query=nonlinear
