#!/bin/sh
# Start vLLM 0.26 on a Qwen3.5-shaped model with the overlay on PYTHONPATH (no backend flag),
# send a few prompts through `vllm bench serve` (bench/serve_tiers.py), then print what proves the
# overlay ran: status lines of every process, the INT8 block size, dispatch counters, KV capacity.
# Usage:
#   sh scripts/h200/serve_smoke.sh MODEL_DIR INPUT_LENS NUM_PROMPTS LABEL [extra serve args...]
set -u
MODEL=$1; LENS=$2; PROMPTS=$3; LABEL=$4; shift 4
PORT=8011
LOG="$OUT/serve-$LABEL.log"
python3 -m vllm.entrypoints.cli.main serve "$MODEL" --served-model-name m --port $PORT \
  --load-format dummy --language-model-only --max-model-len 32768 \
  --additional-config '{"gdn_prefill_backend": "triton"}' "$@" > "$LOG" 2>&1 &
SERVER=$!
i=0
until curl -s localhost:$PORT/health >/dev/null; do
  i=$((i+2)); sleep 2
  if ! kill -0 $SERVER 2>/dev/null || [ $i -gt 420 ]; then echo "server $LABEL did not come up"; tail -40 "$LOG"; exit 1; fi
done
echo "server $LABEL up after ${i}s"
python3 -m bench.serve_tiers --base-url http://127.0.0.1:$PORT --tokenizer "$MODEL" --input-lens "$LENS" --output-len 64 \
  --num-prompts "$PROMPTS" --result-file "$OUT/tiers-$LABEL.json" 2>&1 | tail -15
python3 -m govinda_patch counters
grep -E "govinda|GPU KV cache size|Maximum concurrency|backend|block size|Error|error" "$LOG" | grep -v "Avoid\|DeprecationWarning" | head -40
kill $SERVER; wait $SERVER 2>/dev/null
