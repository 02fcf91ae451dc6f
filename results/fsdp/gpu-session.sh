#!/usr/bin/env bash
# The commands of results/fsdp, as run on one lent host with 4 GPUs (from a checkout, with the
# project's runtime wheels installed under /tmp/site: docs/operations.md, "On a GPU, and on offline machines").
#   bash results/fsdp/gpu-session.sh DIR      → DIR/{session.log, curves/, bench/, smi.csv}
# 1. the embedded 13M base model (GPU 0) while an untrained Llama is drawn (GPU 3): 5.8B on 80 GB cards, 8.2B on 141 GB;
# 2. recipe scalerl-gpu4 for 60 steps: one GPU (seeds 0 and 1), FSDP 1 and FSDP 2 over 2 GPUs (seed 0),
#    the FSDP 1 run killed (SIGKILL) after its step-20 checkpoint and started again: it resumes;
# 3. that model for 4 steps on 4 GPUs: FSDP 1, FSDP 2, and DDP (refused by the estimate, then let
#    through with --no-memory-check to see it run out of memory).
set -u
DIR=${1:-/tmp/fsdp}
mkdir -p "$DIR/curves" "$DIR/bench"
export PYTHONUNBUFFERED=1 PRL_CACHE=$PWD/artifacts
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # the host's rule
PY=python3
log() { echo "$(date +%T) $*" | tee -a "$DIR/session.log"; }
nvidia-smi --query-gpu=timestamp,index,memory.used,utilization.gpu --format=csv,nounits -l 5 > "$DIR/smi.csv" &
SMI=$!

# an untrained Llama whose weights, gradients and AdamW state alone (16 bytes a parameter) exceed one GPU:
# 28 x 4096 (5.8B, 86 GiB) on 80 GB cards, 40 x 4096 (8.2B, 123 GiB + DDP's buckets) on 141 GB ones
SHAPE=$($PY -c "import torch; print('40x4096' if torch.cuda.get_device_properties(0).total_memory > 100 * 2**30 else '28x4096')")
log "1. base model (GPU 0) and the random $SHAPE model (GPU 3)"
CUDA_VISIBLE_DEVICES=0 timeout 600 $PY -m runners base-model scalerl-gpu4 > "$DIR/base-model.log" 2>&1 &
B=$!
CUDA_VISIBLE_DEVICES=3 $PY -c "from pathlib import Path; from tests.bench_memory import random_model; \
random_model('$SHAPE', Path('$DIR/bench'), device='cuda')" > "$DIR/random-model.log" 2>&1 &
M=$!
wait $B; log "base model: $(tail -1 "$DIR/base-model.log")"

log "2. scalerl-gpu4, 60 steps"
RUN=(--set=train.steps=60 --untracked)
C=$DIR/curves
train() {  # NAME DEVICES SEED [launch args...]
  local name=$1 devs=$2 seed=$3; shift 3
  CUDA_VISIBLE_DEVICES=$devs timeout 900 $PY -m runners train scalerl-gpu4 "${RUN[@]}" --set=train.seed="$seed" \
    --run-dir "$C/$name" "$@" >> "$C/$name.log" 2>&1
}
train one-gpu-seed0 0 0 & P1=$!
train one-gpu-seed1 1 1 & P2=$!
train fsdp2-seed0 2,3 0 --gpus 2 --accelerate-config experiments/accelerate/fsdp2.yaml & P3=$!
train fsdp1-seed0 0,1 0 --gpus 2 --accelerate-config experiments/accelerate/fsdp1.yaml & P4=$!
while [ ! -f "$C/fsdp1-seed0/checkpoints/checkpoint-20/prl_state.json" ] && kill -0 $P4 2>/dev/null; do sleep 1; done
sleep 3
PIDS=$(pgrep -f "run-dir $C/fsdp1-seed0" | tr '\n' ' ')  # the launcher and its two ranks (own sessions)
log "killing the FSDP 1 run (processes $PIDS) after checkpoint-20"
kill -9 $PIDS; wait $P4
log "FSDP 1 run after the kill: $(tail -c 300 "$C/fsdp1-seed0/metrics.jsonl" | tail -1 | cut -c1-60)"
train fsdp1-seed0 0,1 0 --gpus 2 --accelerate-config experiments/accelerate/fsdp1.yaml & P4=$!
wait $P1 $P2 $P3 $P4
for r in one-gpu-seed0 one-gpu-seed1 fsdp1-seed0 fsdp2-seed0; do log "$r: $(grep -h 'step  *60/60\|resuming\|rror' "$C/$r.log" | tr '\n' ' ' | cut -c1-300)"; done

wait $M; log "random model: $(tail -1 "$DIR/random-model.log")"
log "3. the $SHAPE model on 4 GPUs"
BIG=(--set=batch.prompts=8 --set=batch.generations=4 --set=batch.micro_batch=8 --set=length.control=none
     --set=length.max_tokens=32 --set=train.steps=4 --set=train.save_every=100 --set=eval.every=100
     --set=eval.prompts=8 --set=eval.samples=4 --set=eval.batch_prompts=4)
bench() { $PY -m tests.bench_fsdp scalerl-gpu4 --gpus 4 --random-model "$SHAPE" "${BIG[@]}" --out "$DIR/bench" \
  --timeout 480 "$@" >> "$DIR/bench/bench.log" 2>&1; log "bench $*: $(tail -c 400 "$DIR/bench/fsdp.csv" | tail -1)"; }
bench --label fsdp1 --accelerate-config experiments/accelerate/fsdp1.yaml
bench --label fsdp2 --accelerate-config experiments/accelerate/fsdp2.yaml
log "the runner's own refusal of DDP:"
timeout 300 $PY -m runners train scalerl-gpu4 "${BIG[@]}" --set=model.path="$DIR/bench/random-llama-$SHAPE" \
  --set=model.size=null --gpus 4 --untracked --run-dir "$DIR/bench/ddp-cli" > "$DIR/bench/ddp-cli.log" 2>&1
log "exit $?: $(grep -h 'needs about' "$DIR/bench/ddp-cli.log" | head -1 | cut -c1-400)"
bench --label ddp --no-memory-check
kill $SMI
log "done"
