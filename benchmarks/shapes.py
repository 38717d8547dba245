"""Named benchmark shapes per family (docs/targets.md)."""

# name, B, Hq, Hkv, D, T, page (None = contiguous)
DECODE = [
    ("B1-T1k", 1, 32, 8, 128, 1024, None),
    ("B1-T4k", 1, 32, 8, 128, 4096, None),
    ("B1-T8k", 1, 32, 8, 128, 8192, None),
    ("B1-T32k", 1, 32, 8, 128, 32768, None),
    ("B1-T128k", 1, 32, 8, 128, 131072, None),
    ("B8-T32k", 8, 32, 8, 128, 32768, None),
    ("B32-T8k", 32, 32, 8, 128, 8192, None),
    ("B1-T32k-D256", 1, 16, 8, 256, 32768, None),
    ("B1-T32k-D512", 1, 16, 2, 512, 32768, None),
    ("B1-T4k-page16", 1, 32, 8, 128, 4096, 16),
    ("B1-T32k-page16", 1, 32, 8, 128, 32768, 16),
    ("B1-T128k-page16", 1, 32, 8, 128, 131072, 16),
    ("B8-T32k-page16", 8, 32, 8, 128, 32768, 16),
    ("B32-T8k-page16", 32, 32, 8, 128, 8192, 16),
]

# Gated DeltaNet (targets.md, Qwen3-Next heads: 16 q/k, 32 v, K = V = 128).
# name, sequence lengths (one entry per sequence; equal lengths run as fixed-length [B, T])
GDN_CHUNK = [
    ("1x4k", [4096]),
    ("1x8k", [8192]),
    ("1x32k", [32768]),
    ("8x4k", [4096] * 8),
    ("varlen-mix-24k", [4096, 1024, 512, 8192, 2048, 300, 5000, 700, 2900]),
]
GDN_HEADS = (16, 32, 128, 128)  # H, HV, K, V
# gdn_recurrent batch sizes (one decode token, fp32 state pool)
GDN_RECURRENT = [1, 32, 256]

# AURA compressed decode (targets.md): name, B, Hq, Hkv, D, T, page (None = contiguous), scheme.
AURA = [
    (f"{name}-{scheme}", B, Hq, Hkv, D, T, page, scheme)
    for scheme, cases in (
        ("aura4v2", [("B1-T4k", 1, 32, 8, 128, 4096, None), ("B1-T8k", 1, 32, 8, 128, 8192, None),
                     ("B1-T32k", 1, 32, 8, 128, 32768, None), ("B1-T64k", 1, 32, 8, 128, 65536, None),
                     ("B1-T128k", 1, 32, 8, 128, 131072, None), ("B8-T32k", 8, 32, 8, 128, 32768, None),
                     ("B8-T32k-page16", 8, 32, 8, 128, 32768, 16), ("B32-T8k", 32, 32, 8, 128, 8192, None),
                     ("B1-T32k-D256", 1, 16, 8, 256, 32768, None)]),
        ("aura4v4", [("B1-T4k", 1, 32, 8, 128, 4096, None), ("B1-T32k", 1, 32, 8, 128, 32768, None),
                     ("B1-T128k", 1, 32, 8, 128, 131072, None), ("B8-T32k", 8, 32, 8, 128, 32768, None)]),
        ("aura8v4", [("B8-T32k", 8, 32, 8, 128, 32768, None)]),
    )
    for name, B, Hq, Hkv, D, T, page in cases
]
