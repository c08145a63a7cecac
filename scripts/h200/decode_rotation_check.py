"""Rotated vs unrotated decode, one fresh process per launch configuration, against the fp32
reference (sm90 table, CUDA_LAUNCH_BLOCKING=1). It found that the split kernel's in-prologue
query rotation, in 64-wide head_dim slices, gave wrong results on sm90 (reports/h200/decode-bandwidth.md);
the query is now rotated before the split kernel, so every slice width runs rotated. From the repo
root on the device:
    . scripts/h200/env.sh; python3 scripts/h200/decode_rotation_check.py   # env.sh puts the repo on PYTHONPATH
Each line: (D, GQA, KV heads, block size, block_n, d_slice, rotation, split|single|store, decodes)
and the largest error, or the failure.
"""
import os, sys, subprocess, json
CASE = r'''
import os, sys, torch
from dataclasses import replace
from govinda_patch.kernel_package import import_kernel
L = import_kernel("int8_kv_layout"); A = import_kernel("int8_paged_attention"); S = import_kernel("int8_kv_store"); lc = import_kernel("launch_configs")
D, G, HKV, BS, BN, DS, ROT, PART, NDEC = [int(x) if x.isdigit() else x for x in sys.argv[1:10]]
dev = torch.device("cuda"); torch.manual_seed(0)
ctx = 4096
nb = NDEC * (ctx // BS + 2) + 1
cache = torch.zeros(L.cache_shape(nb, BS, HKV, D), dtype=torch.int8, device=dev)
bt = (torch.arange(NDEC * (ctx // BS + 1)).reshape(NDEC, -1) + 1).int().to(dev)
k = torch.randn(NDEC * ctx, HKV, D, device=dev, dtype=torch.bfloat16); v = torch.randn_like(k)
slots = torch.cat([bt[i].long()[torch.arange(ctx, device=dev) // BS] * BS + torch.arange(ctx, device=dev) % BS for i in range(NDEC)])
S.store_kv_int8(k, v, cache, slots, block_size=BS, rotation=ROT); torch.cuda.synchronize()
if PART == "store": print("OK store"); sys.exit(0)
q = torch.randn(NDEC, HKV * G, D, device=dev, dtype=torch.bfloat16); out = torch.zeros_like(q)
t = lc.ARCH_TABLES["cuda_sm90"]
cfg = replace(t, decode={D: lc.KernelConfig(block_n=BN, num_warps=4, d_slice=DS)})
if PART == "single": cfg = replace(cfg, decode_splits=replace(cfg.decode_splits, max_splits=1))
A.paged_attention_int8(q, cache, out, torch.arange(NDEC + 1, dtype=torch.int32, device=dev), torch.full((NDEC,), ctx, dtype=torch.int32, device=dev), bt,
    block_size=BS, num_kv_heads=HKV, softmax_scale=D**-0.5, max_query_len=1, max_seq_len=ctx, num_decodes=NDEC, configs=cfg, rotation=ROT)
torch.cuda.synchronize()
ref = A.attention_reference(q, cache, torch.arange(NDEC + 1, dtype=torch.int32, device=dev), torch.full((NDEC,), ctx, dtype=torch.int32, device=dev), bt,
    block_size=BS, num_kv_heads=HKV, softmax_scale=D**-0.5, rotation=ROT)
print("OK", float((out.float() - ref).abs().max()))
'''
open("/tmp/case.py", "w").write(CASE)
env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1")
cases = [
    (256, 6, 4, 1552, 64, 128, "none", "split", 1),
    (256, 6, 4, 1552, 64, 64, "hadamard", "split", 1),
    (256, 6, 4, 1552, 64, 64, "hadamard", "single", 1),
    (256, 6, 4, 1552, 64, 64, "hadamard", "split", 8),
    (256, 6, 4, 1552, 64, 128, "hadamard", "split", 1),
    (256, 6, 4, 1552, 64, 128, "hadamard", "single", 1),
    (256, 6, 4, 1552, 128, 64, "hadamard", "split", 1),
    (256, 6, 4, 1552, 128, 128, "hadamard", "split", 1),
    (256, 6, 4, 1552, 32, 64, "hadamard", "split", 1),
    (128, 4, 8, 16, 64, 64, "hadamard", "split", 1),
    (128, 4, 8, 16, 64, 128, "hadamard", "split", 1),
    (128, 4, 8, 16, 128, 64, "hadamard", "split", 1),
    (64, 4, 8, 16, 64, 64, "hadamard", "split", 1),
]
for c in cases:
    r = subprocess.run([sys.executable, "/tmp/case.py", *map(str, c)], env=env, capture_output=True, text=True, timeout=120)
    tail = (r.stdout + r.stderr).strip().splitlines()
    err = [l for l in tail if "Error" in l or "error" in l][:2]
    print(c, "rc", r.returncode, tail[-1][:200] if tail else "", err[:1], flush=True)
