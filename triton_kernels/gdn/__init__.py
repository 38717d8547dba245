"""Gated DeltaNet Triton kernels (gdn.md): ``chunk`` (prefill stages and the fused ``gdn_chunk``),
``recurrent`` (decode) and ``conv`` (the causal conv of the front end, ops.md §3b). Launchers take
exactly their op's schema arguments."""
