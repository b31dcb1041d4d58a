#!/usr/bin/env bash
# Throughput of the bundled trainer on one GPU node: tokens/s per GPU and MFU of the ~1B preset.
#
#   deploy/gpu-benchmark.sh                 # synthetic data (random tokens, vocab 128256, seq_len 2048)
#   deploy/gpu-benchmark.sh <manifest-url>  # a published dataset version
#
# Environment: NPROC (GPUs to use, default: all), STEPS (default 40), WARMUP (steps left out of the
# summary: compile and allocator warm-up, default 10), MICRO (sequences per GPU per step, default 8),
# PRESET (configs/train-<PRESET>.yaml, default 1b), OUT (run directory, default a temp dir).
# Checkpoints and validation are off: this measures the training step and the input pipeline only.
set -euo pipefail

cd "$(dirname "$0")/.."
NPROC=${NPROC:-$(nvidia-smi -L | wc -l)}
STEPS=${STEPS:-40}
WARMUP=${WARMUP:-10}
MICRO=${MICRO:-8}
PRESET=${PRESET:-1b}
OUT=${OUT:-$(mktemp -d -t gristmill-gpu-bench-XXXX)}
MANIFEST=${1:-}

if [[ -z "$MANIFEST" ]]; then
  echo "building a synthetic dataset under $OUT/data" >&2
  MANIFEST=$(python -c "import sys; from gristmill.manifests.synthetic import build_synthetic; \
print(build_synthetic(sys.argv[1], vocab_size=128256, seq_len=2048, shard_rows=(1024,), val_rows=(64,), \
tokens='random').url)" "$OUT/data")
fi

python -c "import flash_attn" 2>/dev/null && echo "flash-attn: installed" >&2 || echo "flash-attn: not installed (SDPA flash backend)" >&2
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader >&2

torchrun --standalone --nproc_per_node "$NPROC" -m gristmill.trainer "configs/train-$PRESET.yaml" \
  --set "data.manifest=$MANIFEST" --set "run.dir=$OUT/run" --set "run.steps=$STEPS" --set run.log_every=1 \
  --set "data.global_batch=$((NPROC * MICRO))" --set "data.micro_batch=$MICRO" --set "data.cache_dir=$OUT/cache" \
  --set checkpoint.enabled=false --set eval.every=0 --set optimizer.warmup_steps=5 --set run.tensorboard=false

python - "$OUT/run/metrics.jsonl" "$WARMUP" "$PRESET" "$NPROC" <<'PY'
import json, statistics, sys
path, warmup, preset, nproc = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
steps = [r for r in map(json.loads, open(path)) if r["kind"] == "train" and r["step"] > warmup]
if not steps:
    sys.exit(f"no steps after the first {warmup} in {path}: raise STEPS")
tps = statistics.median(r["tokens_per_s_per_device"] for r in steps)
mfus = [r["mfu"] for r in steps if r["mfu"] is not None]
wait = statistics.median(r["input_wait_pct"] for r in steps)
print(f"preset {preset}, {nproc} GPU(s), steps {warmup + 1}..{steps[-1]['step']} (median)")
print(f"tokens/s per GPU  {tps:,.0f}")
print(f"tokens/s total    {tps * nproc:,.0f}")
print(f"MFU               {100 * statistics.median(mfus):.1f}%" if mfus else
      "MFU               unknown: this GPU is not in trainer.metrics.PEAK_BF16_FLOPS")
print(f"input wait        {wait:.2f}% of step time")
PY
