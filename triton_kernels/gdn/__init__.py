"""Gated DeltaNet Triton kernels (gdn.md): ``chunk`` (prefill stages and the fused ``gdn_chunk``)
and ``recurrent`` (decode). Launchers take exactly their op's schema arguments."""
