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
  python - "$OUT/data" <<'PY'
import os, sys
import numpy as np
import pyarrow as pa
from tokenizers import Tokenizer, models
from manifests import DatasetBuilder, Input, ManifestStore

root, vocab, seq_len, rows = sys.argv[1], 128256, 2048, 1024
os.makedirs(root, exist_ok=True)
tok = os.path.join(root, "tokenizer.json")
Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0")).save(tok)
b = DatasetBuilder(os.path.join(root, "staging"), dataset="synthetic", seq_len=seq_len, tokenizer_json=tok,
                   vocab_size=vocab, eos_id=0)
rng = np.random.default_rng(0)
doc = {k: [] for k in ("shard", "row", "start", "length", "doc_id", "source", "position", "lang")}
for split, n in (("train", rows), ("validation", 64)):
    shard = len(b.shards)
    b.add_shard(split, rng.integers(1, vocab, size=(n, seq_len + 1), dtype=np.int64))
    for r in range(n):
        for k, v in zip(doc, (shard, r, 0, seq_len + 1, f"syn-{shard}-{r}", "synthetic", r, "xx")):
            doc[k].append(v)
b.set_doc_index(pa.table(doc))
m = b.manifest(inputs=[Input("synthetic://", 0, "0" * 64)], config={"synthetic": True}, code_version="bench", stats={})
print(ManifestStore(os.path.join(root, "store")).publish(m, b.dir).url)
PY
  MANIFEST="$OUT/data/store/synthetic"
fi

python -c "import flash_attn" 2>/dev/null && echo "flash-attn: installed" >&2 || echo "flash-attn: not installed (SDPA flash backend)" >&2
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader >&2

torchrun --standalone --nproc_per_node "$NPROC" -m trainer "configs/train-$PRESET.yaml" \
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
