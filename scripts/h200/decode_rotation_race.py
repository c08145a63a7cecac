"""Rotated decodes replayed from a CUDA graph, on the H200: the reduce kernel's last program of
each output row rotates it after an atomic count (kernels/int8_decode_attention.py), so a
missing release/acquire would show as replays that differ from each other or from the fp32
reference. From the repo root on the device:
    . scripts/h200/env.sh; PYTHONPATH=$PWD:/tmp/site python3 scripts/h200/decode_rotation_race.py
Each line: the case, the error against the reference, how many of the replays were not bitwise
equal to the first, and whether every row count is back at zero.
"""
import torch

from govinda_patch.kernel_package import import_kernel

layout = import_kernel("int8_kv_layout")
attention = import_kernel("int8_paged_attention")
store = import_kernel("int8_kv_store")
REPLAYS = 300
CASES = [  # head_dim, GQA group, KV heads, block size, decodes, context
    (256, 6, 4, 1552, 1, 16384),
    (256, 6, 4, 1552, 8, 8192),
    (256, 6, 4, 1552, 32, 4096),
    (128, 4, 8, 16, 1, 32768),
    (128, 4, 8, 16, 8, 8192),
    (64, 4, 8, 16, 1, 4096),  # last: a fault here would end the run
    (64, 4, 8, 16, 8, 4096),
]
device = torch.device("cuda")
for head_dim, group, kv_heads, block_size, decodes, context in CASES:
    torch.manual_seed(0)
    per_seq = -(-context // block_size)
    cache = torch.zeros(layout.cache_shape(decodes * per_seq + 1, block_size, kv_heads, head_dim), dtype=torch.int8, device=device)
    block_table = (torch.arange(decodes * per_seq, device=device).reshape(decodes, per_seq) + 1).int()
    positions = torch.arange(context, device=device)
    slots = torch.cat([block_table[i].long()[positions // block_size] * block_size + positions % block_size for i in range(decodes)])
    keys = torch.randn(decodes * context, kv_heads, head_dim, device=device, dtype=torch.bfloat16)
    store.store_kv_int8(keys, torch.randn_like(keys), cache, slots, block_size=block_size, rotation="hadamard")
    query = torch.randn(decodes, kv_heads * group, head_dim, device=device, dtype=torch.bfloat16)
    output = torch.zeros_like(query)
    starts = torch.arange(decodes + 1, dtype=torch.int32, device=device)
    seq_lens = torch.full((decodes,), context, dtype=torch.int32, device=device)
    workspace = attention.DecodeWorkspace.allocate(decodes, kv_heads * group, head_dim, device, num_kv_heads=kv_heads)
    args = dict(block_size=block_size, num_kv_heads=kv_heads, softmax_scale=head_dim**-0.5)

    def run():
        attention.paged_attention_int8(query, cache, output, starts, seq_lens, block_table, max_query_len=1,
                                       max_seq_len=context, num_decodes=decodes, workspace=workspace,
                                       rotation="hadamard", **args)

    try:
        run()  # compile outside the capture
        torch.cuda.synchronize()
    except RuntimeError as exc:  # which launch faulted (run with CUDA_LAUNCH_BLOCKING=1)
        import traceback
        frames = [f"{frame.name}: {frame.line}" for frame in traceback.extract_tb(exc.__traceback__)]
        print((head_dim, group, kv_heads, block_size, decodes, context), "FAILED", str(exc)[:120], "|", frames[-3:], flush=True)
        break
    reference = attention.attention_reference(query, cache, starts, seq_lens, block_table, rotation="hadamard", **args)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    graph.replay()
    torch.cuda.synchronize()
    first = output.clone()
    differing = 0
    for _ in range(REPLAYS):
        output.zero_()
        graph.replay()
        torch.cuda.synchronize()
        differing += int(not torch.equal(output, first))
    error = float((first.float() - reference).abs().max())
    print((head_dim, group, kv_heads, block_size, decodes, context),
          f"splits {attention.decode_splits_for(decodes, kv_heads, device)}",
          f"max error {error:.3g}", f"replays differing {differing}/{REPLAYS}",
          f"row counts zero {bool((workspace.row_count == 0).all())}", flush=True)
