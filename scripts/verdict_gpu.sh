#!/usr/bin/env bash
# nlq study verdict (or STUDY=verdict-lr) on one GPU as N concurrent shards (each shard a process on the same device; the model is tiny,
# so one process uses a sliver of an H200 and N of them share it). The same pre-registered design as on the CPU,
# in fp32 (train.dtype=float32, as the CPU runs), on a corpus prepared on that machine.
#
#   scripts/verdict_gpu.sh OUT_DIR DATA_DIR [N]          (N defaults to 14: one chain per shard and arm)
#   scripts/verdict_gpu.sh OUT_DIR DATA_DIR N --dry-run  (prints each shard's runs; trains nothing; works on a CPU)
set -euo pipefail
out=$1
data=$2
n=${3:-14}
study=${STUDY:-verdict}  # STUDY=verdict-lr runs the lr study the same way
dry=${4:-}
if [[ -z "$dry" ]]; then
  nlq prepare --source pypkg --tokenizer bpe:2048 --out "$data"
fi
mkdir -p "$(dirname "$out")"
for k in $(seq 1 "$n"); do
  if [[ -n "$dry" ]]; then
    nlq study "$study" --out "$out" --data "$data" --shard "$k/$n" --train.device=cuda --train.dtype=float32 --dry-run
  else
    OMP_NUM_THREADS=1 nlq study "$study" --out "$out" --data "$data" --shard "$k/$n" --train.device=cuda \
      --train.dtype=float32 > "$out.shard$k.log" 2>&1 &
  fi
done
wait
if [[ -z "$dry" ]]; then
  nlq report "$out"
fi
