# Source from the repo root on the H200 device machine: installs the carried vLLM 0.26 bundle
# once (skipped while /tmp/site/vllm exists) and puts the overlay in front of it.
if [ ! -d /tmp/site/vllm ]; then
  sh .device/install.sh > "${OUT:-/tmp}/install.log" 2>&1 || { tail -20 "${OUT:-/tmp}/install.log"; exit 1; }
fi
. /tmp/site/vllm_env.sh
export PYTHONPATH="$PWD:/tmp/site"
export PYTHONUNBUFFERED=1
export GOVINDA_CACHE_DIR=/tmp/govinda-cache
