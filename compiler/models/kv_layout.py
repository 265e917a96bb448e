"""The paged KV cache's layout, shared by every attention kernel (paged_attention.py dispatches
to window_attention.py, cpu_attention.py and longrope.py, which index the same pages)."""

PAGE_SIZE = 16  # tokens per KV page; TVM's kernels are generated for this size
