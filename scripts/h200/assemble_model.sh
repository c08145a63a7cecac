#!/bin/sh
# A dummy-weight model directory for the H200 from two halves: the config committed under
# scripts/h200/models/NAME/ and the synthetic 8192-token BPE tokenizer of the carried bundle
# (TOKENIZER_DIR, e.g. .device/models/qwen3_5-27b-shape). The tokenizer (547 KB) stays out of git:
# the bundle already travels with every device call. Run from the checkout's root:
#   sh scripts/h200/assemble_model.sh NAME TOKENIZER_DIR [DEST]     (DEST defaults to /tmp/NAME)
# It prints DEST. ab_bench_serve.sh calls it for a sides file whose model is /tmp/NAME.
set -eu
[ "$#" -ge 2 ] || { echo "usage: $0 NAME TOKENIZER_DIR [DEST]" >&2; exit 2; }
config=scripts/h200/models/$1/config.json
dest=${3:-/tmp/$1}
[ -f "$config" ] || { echo "no $config" >&2; exit 1; }
for file in tokenizer.json tokenizer_config.json; do
    [ -f "$2/$file" ] || { echo "no $2/$file" >&2; exit 1; }
done
mkdir -p "$dest"
cp -f "$config" "$2/tokenizer.json" "$2/tokenizer_config.json" "$dest/"
echo "$dest"
