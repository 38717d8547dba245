"""Gated DeltaNet Triton kernels (gdn.md): ``chunk`` (the fused ``gdn_chunk``; its pipeline in ``prep``,
``state_pass``, ``segments`` and ``state_pass_sm90``, helpers in ``_common`` and ``_jit``), ``recurrent`` (decode) and ``conv`` (the causal conv of the front end, ops.md §3b). Launchers take
exactly their op's schema arguments."""
