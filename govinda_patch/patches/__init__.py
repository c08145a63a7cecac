"""One module per patch. Each defines ``apply(ctx: govinda_patch.manager.PatchContext)``.

Why/how/targets/verified versions/upstream status/removal of each patch live in ``patches.yaml``
(the single source the docs are generated from); module docstrings only say what the code does.
Every change goes through ``ctx.record`` so the manager can revert it exactly.
"""
