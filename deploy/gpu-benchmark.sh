#!/usr/bin/env bash
# One go on a GPU machine (made for one H200; any CUDA node works): the ~1B preset in bf16 with
# compiled blocks and flash attention where available (flash-attn when installed, else SDPA's
# flash backend), trained for GPU_BENCH_SECONDS of wall time after its first step on a learnable
# synthetic dataset (counting rows, vocab 128,256, seq_len 2,048). Records tokens/s, MFU,
# input-wait %, the peak memory against the budget the trainer prints, and the loss curve:
#
#   deploy/gpu-benchmark.sh                      # -> $OUT/results.md, results.json, loss_curve.csv, metrics.jsonl, train.log
#   deploy/gpu-benchmark.sh <manifest-url>       # a published dataset version instead
#   GPU_BENCH_PRESET=tiny deploy/gpu-benchmark.sh  # the CPU dry run: tiny model, fp32, no compile, 10 s
#
# Environment: GPU_BENCH_PRESET (1b | tiny; default 1b), GPU_BENCH_SECONDS (training wall time
# after the first step; 120, tiny 10), GPU_BENCH_MAX_STARTUP (seconds allowed before the first
# step: data, init, compile; 300), MICRO (sequences per GPU per step; 8), AC (activation
# checkpointing none | selective | full; none: the 1B fits an H200's 141 GB without it, the
# budget says 80 GB), COMPILE (true; tiny false), STEPS (the LR schedule's length; 2000),
# WARMUP (steps left out of the throughput medians; 10, tiny 2), NPROC (GPUs; default all),
# GPU_BENCH_SET (more `--set KEY=VALUE` for the train job, space-separated, e.g.
# "model.document_mask=true"), GPU_BENCH_DOC_TOKENS (MIN,MAX: pack documents of that many tokens
# into the rows instead of one document a row, so the document mask has boundaries to mask),
# PYTHON (python3), OUT (where the results go; default a temp dir), GPU_BENCH_WORK (scratch
# for data, cache and run; default a temp dir), WHEELS (a folder of wheels for packages the
# machine lacks; default .whl when present), GPU_BENCH_CKPT_EVERY (steps between checkpoints; 0 =
# none, the default: then this measures the step and the input pipeline alone). With
# GPU_BENCH_CKPT_EVERY > 0 the checkpoints go to a local object store, the tests' moto S3 server
# (tests/s3server.py on 127.0.0.1; needs moto[server], boto3 and s3fs, as wheels if missing), through
# the two tiers (DCP to local disk, background upload, commit): results gain each save's blocked time
# (training stopped for it) and its time to commit on the store (checkpoint.md has the table).
#
# Install: none. The checkout is put on PYTHONPATH as `gristmill` (a folder of links), with the
# wheels in WHEELS installed beside it (--no-index: no network needed). An image with torch but
# without pydantic or zstandard (the project's device image, Python 3.12) needs:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
#     pydantic pydantic-core annotated-types typing-inspection zstandard
# (pydantic and pydantic-core at matching versions: pip download pydantic==X resolves them together
# without --no-deps.) Validation is off; checkpoints too unless GPU_BENCH_CKPT_EVERY is set.
set -euo pipefail

cd "$(dirname "$0")/.."
PRESET=${GPU_BENCH_PRESET:-1b}
PY=${PYTHON:-python3}
OUT=${OUT:-$(mktemp -d -t gristmill-gpu-bench-XXXX)}
WORK=${GPU_BENCH_WORK:-$(mktemp -d -t gristmill-gpu-work-XXXX)}
MAX_STARTUP=${GPU_BENCH_MAX_STARTUP:-300}
MICRO=${MICRO:-8}
AC=${AC:-none}
STEPS=${STEPS:-2000}
MANIFEST=${1:-}
DOC_TOKENS=${GPU_BENCH_DOC_TOKENS:+(${GPU_BENCH_DOC_TOKENS})}; DOC_TOKENS=${DOC_TOKENS:-None}
read -ra EXTRA_SETS <<< "${GPU_BENCH_SET:-}"
CKPT_EVERY=${GPU_BENCH_CKPT_EVERY:-0}
mkdir -p "$OUT" "$WORK"

case "$PRESET" in
  1b)   SECONDS_TRAIN=${GPU_BENCH_SECONDS:-120}; WARMUP=${WARMUP:-10}; COMPILE=${COMPILE:-true}
        VOCAB=128256; SEQ=2048; ROWS="(512, 512, 512, 512)"; PRECISION=bf16; ATTENTION=auto
        NPROC=${NPROC:-$(nvidia-smi -L | wc -l)} ;;
  tiny) SECONDS_TRAIN=${GPU_BENCH_SECONDS:-10}; WARMUP=${WARMUP:-2}; COMPILE=${COMPILE:-false}
        VOCAB=512; SEQ=128; ROWS="(256, 256)"; PRECISION=fp32; ATTENTION=sdpa; NPROC=${NPROC:-1} ;;
  *)    echo "GPU_BENCH_PRESET must be 1b or tiny, got '$PRESET'" >&2; exit 2 ;;
esac

# -- this checkout as `gristmill`, without installing it ------------------------------------------
# A folder of links on PYTHONPATH maps the top-level parts to gristmill.<part> as pyproject's
# package-dir does: no pip, no build backend, nothing written to the machine's site-packages,
# and the code that runs is this checkout's. Wheels for packages the machine lacks go in too.
SITE="$WORK/site"
rm -rf "$SITE"; mkdir -p "$SITE/gristmill"
for f in "$PWD"/gristmill/*; do [[ "$(basename "$f")" == __pycache__ ]] || ln -s "$f" "$SITE/gristmill/"; done  # modules and subpackages (cli/, report/)
for part in manifests pipeline loader trainer audit; do ln -s "$PWD/$part" "$SITE/gristmill/$part"; done
WHEELS=${WHEELS-$( [[ -d .whl ]] && echo .whl || true )}  # WHEELS="" : none
if [[ -n "$WHEELS" ]]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "$WHEELS"/*.whl
fi
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
# Python 3.11+: no working directory on sys.path, else the checkout's own gristmill/ folder (which
# holds no trainer/) would shadow the links for `python -m` and `-c`, torchrun's workers included.
export PYTHONSAFEPATH=1
export GRISTMILL_CODE_VERSION="gristmill+g$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)"
"$PY" -c "import gristmill.trainer.train" || {
  echo "gristmill.trainer does not import: bring the missing packages as wheels (see the header)" >&2; exit 2; }

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: $(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)"
  "$PY" -c "import gristmill.trainer; print('gristmill:', gristmill.trainer.__path__[0])"
  "$PY" -c "import torch; print('torch:', torch.__version__, '| cuda:', torch.version.cuda, '| device:', torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu')"
  "$PY" -c "import flash_attn; print('flash-attn:', flash_attn.__version__)" 2>/dev/null || echo "flash-attn: not installed (SDPA, flash backend on GPU)"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
} | tee "$OUT/environment.txt" >&2

# -- data: a learnable synthetic set, so the loss curve means something -------------------------
if [[ -z "$MANIFEST" ]]; then
  MANIFEST=$("$PY" -c "import sys; from gristmill.manifests.synthetic import build_synthetic; \
print(build_synthetic(sys.argv[1], dataset='count', vocab_size=$VOCAB, seq_len=$SEQ, shard_rows=$ROWS, \
val_rows=(16,), tokens='counting', doc_tokens=${DOC_TOKENS}).url)" "$WORK/data")
fi

# -- checkpoints (GPU_BENCH_CKPT_EVERY > 0): to a local S3 server, through local disk -------------
CKPT_SETS=(--set checkpoint.enabled=false)
if (( CKPT_EVERY > 0 )); then
  PORT=$("$PY" -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
  export AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing AWS_SESSION_TOKEN=testing \
    AWS_DEFAULT_REGION=us-east-1 AWS_EC2_METADATA_DISABLED=true \
    AWS_ENDPOINT_URL="http://127.0.0.1:$PORT" AWS_ENDPOINT_URL_S3="http://127.0.0.1:$PORT"
  "$PY" tests/s3server.py "$PORT" > "$WORK/moto.log" 2>&1 &
  MOTO=$!
  trap 'kill $MOTO 2>/dev/null || true' EXIT
  for _ in $(seq 60); do
    "$PY" -c "import urllib.request; urllib.request.urlopen('$AWS_ENDPOINT_URL/moto-api/', timeout=1)" 2>/dev/null && break
    sleep 0.5
  done
  "$PY" -c "import boto3; boto3.client('s3').create_bucket(Bucket='gpu-bench')"
  CKPT_SETS=(--set checkpoint.enabled=true --set "checkpoint.every=$CKPT_EVERY" --set checkpoint.keep=2
             --set checkpoint.dir=s3://gpu-bench/run/checkpoints --set "checkpoint.local_dir=$WORK/run/checkpoints")
fi

# -- train: the clock starts at the first step's record; SIGTERM stops it after a step -----------
RUN="$WORK/run"
rm -rf "$RUN"
ARGS=("configs/train-1b.yaml" --set "model.preset=$PRESET" --set "data.manifest=$MANIFEST" --set "run.dir=$RUN"
      --set "run.steps=$STEPS" --set run.log_every=1 --set run.tensorboard=false --set "data.cache_dir=$WORK/cache"
      --set "data.global_batch=$((NPROC * MICRO))" --set "data.micro_batch=$MICRO" --set data.order=global
      "${CKPT_SETS[@]}" --set eval.every=0 --set optimizer.warmup_steps=20
      --set "parallelism.mixed_precision=$PRECISION" --set "parallelism.activation_checkpoint=$AC"
      --set "parallelism.compile=$COMPILE" --set "parallelism.attention=$ATTENTION")
for kv in "${EXTRA_SETS[@]}"; do ARGS+=(--set "$kv"); done
if [[ "$NPROC" -gt 1 ]]; then
  LAUNCH=("$PY" -m torch.distributed.run --standalone --nproc_per_node "$NPROC" -m gristmill.trainer)
else
  LAUNCH=("$PY" -m gristmill.trainer)  # one process: no torchrun, a group of one
fi
PYTHONUNBUFFERED=1 "${LAUNCH[@]}" "${ARGS[@]}" > "$OUT/train.log" 2>&1 &
PID=$!
started=$(date +%s)
until grep -qs '"kind": "train"' "$RUN/metrics.jsonl"; do
  if ! kill -0 "$PID" 2>/dev/null; then
    tail -40 "$OUT/train.log" >&2; echo "the trainer ended before its first step" >&2; exit 1
  fi
  if (( $(date +%s) - started > MAX_STARTUP )); then
    kill -TERM "$PID"; sleep 5; kill -KILL "$PID" 2>/dev/null || true
    tail -40 "$OUT/train.log" >&2; echo "no first step within $MAX_STARTUP s" >&2; exit 1
  fi
  sleep 1
done
echo "first step after $(( $(date +%s) - started )) s; training $SECONDS_TRAIN s more" >&2
for _ in $(seq "$SECONDS_TRAIN"); do
  kill -0 "$PID" 2>/dev/null || break  # run.steps reached first
  sleep 1
done
# SIGTERM (SIGINT is ignored by a background job of a script): the trainer stops after the step
# it is in and exits 143; under torchrun the launcher reports the workers' stop as its failure.
kill -TERM "$PID" 2>/dev/null || true
status=0; wait "$PID" || status=$?
if [[ $status -ne 0 ]] && ! grep -q "SIGTERM after step" "$OUT/train.log"; then
  tail -40 "$OUT/train.log" >&2; echo "the trainer failed (exit $status)" >&2; exit 1
fi
cp "$RUN/metrics.jsonl" "$OUT/metrics.jsonl"

# -- summary ---------------------------------------------------------------------------------
"$PY" - "$OUT" "$PRESET" "$NPROC" "$WARMUP" "$SECONDS_TRAIN" "$MICRO" "$SEQ" "$AC" "$COMPILE" <<'PY'
import json, os, statistics, sys
out, preset, nproc, warmup, seconds, micro, seq, ac, compiled = sys.argv[1:]
nproc, warmup, micro, seq = int(nproc), int(warmup), int(micro), int(seq)
records = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
train = [r for r in records if r["kind"] == "train"]
budget = next((r for r in records if r["kind"] == "budget"), None)
memory = ([r for r in records if r["kind"] == "memory"] or [None])[-1]  # step 2's: Adam moments live (trainer/run_log.py)
saves = [r for r in records if r["kind"] == "checkpoint"]  # GPU_BENCH_CKPT_EVERY: one per save
steady = [r for r in train if r["step"] > warmup]
if not steady:
    sys.exit(f"only {len(train)} steps, none after the first {warmup}: raise GPU_BENCH_SECONDS")
med = lambda key: statistics.median(r[key] for r in steady)
mfus = [r["mfu"] for r in steady if r["mfu"] is not None]
elapsed, curve = 0.0, []
for r in train:
    elapsed += r["step_s"]
    curve.append({"step": r["step"], "elapsed_s": round(elapsed, 3), "loss": r["loss"]})
result = {
    "preset": preset, "gpus": nproc, "micro_batch": micro, "seq_len": seq, "activation_checkpoint": ac,
    "compile": compiled, "steps": len(train), "steady_steps": f"{steady[0]['step']}..{steady[-1]['step']}",
    "tokens_per_s_per_device": med("tokens_per_s_per_device"), "tokens_per_s": med("tokens_per_s"),
    "mfu": statistics.median(mfus) if mfus else None, "input_wait_pct_median": med("input_wait_pct"),
    "input_wait_pct_mean": statistics.fmean(r["input_wait_pct"] for r in steady), "step_s": med("step_s"),
    "budget_bytes": budget and budget["total_bytes"], "budget_terms": budget and budget["bytes"],
    "max_allocated_bytes": memory and memory["max_allocated_bytes"], "memory_after_step": memory and memory["step"],
    "allocated_between_steps_bytes": memory and memory["allocated_bytes"], "first_step_s": train[0]["step_s"],
    "extra_sets": os.environ.get("GPU_BENCH_SET", ""), "doc_tokens": os.environ.get("GPU_BENCH_DOC_TOKENS", ""),
    "peak_over_budget": memory and memory["ratio"], "loss_first": train[0]["loss"], "loss_last": train[-1]["loss"],
    "train_seconds": round(elapsed, 1), "loss_curve": curve,
    "checkpoints": [{k: r.get(k) for k in ("step", "blocked_s", "waited_s", "young_daly_interval_s", "young_daly_every")}
                    for r in saves],
}
json.dump(result, open(os.path.join(out, "results.json"), "w"), indent=1)
with open(os.path.join(out, "loss_curve.csv"), "w") as f:
    f.write("step,elapsed_s,loss\n" + "".join(f"{c['step']},{c['elapsed_s']},{c['loss']:.5f}\n" for c in curve))
every = max(1.0, float(seconds) / 12)
mfu_text = "unknown (device not in the peak table)" if result["mfu"] is None else f"{100 * result['mfu']:.1f}%"
gb = lambda b: "n/a (not CUDA)" if b is None else f"{b / 1e9:.2f} GB"
env = open(os.path.join(out, "environment.txt")).read().strip()
lines = [f"# gristmill trainer: {preset} preset, {nproc} device(s)", "", "```", env, "```", "",
         f"micro-batch {micro} x seq_len {seq} per device, activation checkpointing {ac}, compile {compiled}"
         + (f", --set {result['extra_sets']}" if result["extra_sets"] else "")
         + (f", documents of {result['doc_tokens']} tokens" if result["doc_tokens"] else "") + "; "
         f"{len(train)} steps in {elapsed:.0f} s of training (medians over steps {result['steady_steps']})", "",
         "| metric | value |", "|---|---|",
         f"| tokens/s per device | {result['tokens_per_s_per_device']:,.0f} |",
         f"| tokens/s total | {result['tokens_per_s']:,.0f} |",
         f"| MFU | {mfu_text} |",
         f"| step time | {result['step_s']:.3f} s |",
         f"| input wait | {result['input_wait_pct_median']:.2f}% median, {result['input_wait_pct_mean']:.2f}% mean |",
         f"| memory budget (printed at start) | {gb(result['budget_bytes'])} |",
         f"| peak allocated (steps 1-{memory['step'] if memory else 2}) | {gb(result['max_allocated_bytes'])}"
         + (f" ({result['peak_over_budget']:.2f}x the budget; {gb(memory['allocated_bytes'])} held between steps)"
            if memory else "") + " |",
         f"| first step (compile, allocator warm-up) | {result['first_step_s']:.1f} s |",
         f"| loss | {result['loss_first']:.3f} at step 1 -> {result['loss_last']:.3f} at step {train[-1]['step']} |",
         ]
if saves:
    blocked = statistics.median(r["blocked_s"] for r in saves)
    lines += [f"| checkpoint: training blocked per save (to s3:// on a local moto server, through local disk) | "
              f"{blocked:.2f} s median over {len(saves)} saves (" + ", ".join(f"{r['blocked_s']:.2f}" for r in saves)
              + f"; of it waiting for the previous upload: {max(r['waited_s'] for r in saves):.2f} s at most) |",
              f"| checkpoint: Young/Daly interval for that cost | {saves[-1]['young_daly_interval_s']:.0f} s "
              f"= {saves[-1]['young_daly_every']} steps |"]
lines += ["", f"Loss curve (every ~{every:.0f} s of training; all steps in loss_curve.csv):", "", "| s | step | loss |", "|---|---|---|"]
next_at = 0.0
for c in curve:
    if c["elapsed_s"] >= next_at or c is curve[-1]:
        lines.append(f"| {c['elapsed_s']:.0f} | {c['step']} | {c['loss']:.3f} |")
        next_at = c["elapsed_s"] + every
open(os.path.join(out, "results.md"), "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
echo "results in $OUT" >&2
