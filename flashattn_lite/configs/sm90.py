"""Configs for compute capability 9.0 (H100, H200): data for ``configs.lookup``.

Seeded from what autotuning picked on the H100 in recorded runs (``benchmarks/NOTES.md``,
``benchmarks/results/*.json``; each row says which). Kernels and variants without a row take the
first config their prune function keeps. Regenerate on the GPU with
``flashattn-lite tune --out flashattn_lite/configs/sm90.py`` (or ``--out table.json`` to try it
first through ``FLASHATTN_LITE_CONFIG_TABLE``).
"""

_DECODE_SWEEPS = "autotuned in benchmarks/results/decode_sweep-20261123-*.json (Hq 32, Hkv 8)"
_ATTN_RUN1 = "NOTES.md run 1: autotune picked it for d 64 and 128, causal or not, N 2k-16k"


def _decode(len_bucket, block_n, warps, stages, page_size=1):
    return {"key": {"dtype": "bfloat16", "HEAD_DIM": 128, "HEAD_DIM_V": 128, "BLOCK_M": 16,
                    "PAGED": page_size > 1, "PAGE_SIZE": page_size, "len_bucket": len_bucket},
            "config": {"kwargs": {"BLOCK_N": block_n}, "num_warps": warps, "num_stages": stages},
            "source": _DECODE_SWEEPS}


def _attn(d, causal, block_m, block_n, warps, stages, source, dtype="bfloat16", **key):
    # Option flags left out of a row (window left side, mask, softcap, ALiBi, sinks, varlen,
    # dropout) match only calls with the option off; causal is the window's right side at 0.
    return {"key": {"dtype": dtype, "HEAD_DIM": d, "HEAD_DIM_V": d, "HAS_RIGHT": causal, **key},
            "config": {"kwargs": {"BLOCK_M": block_m, "BLOCK_N": block_n}, "num_warps": warps,
                       "num_stages": stages},
            "source": source}


_TUNED = "flashattn-lite tune on the H100, triton 3.6, 2026-11-24 (B·N 16k tokens, hidden 2048)"
# (kernel, dtype, d, causal, length class, BLOCK_M, BLOCK_N, warps, stages) as tuned; fp16 at d 128
# picked what bf16 did except the forward's non-causal 4k row.
_TUNED_ROWS = [
    ("_attn_fwd_kernel", dt, 128, c, n, *cfg)
    for dt in ("bfloat16", "float16")
    for c, n, cfg in ((False, 4096, (128, 128, 8, 2) if dt == "bfloat16" else (128, 64, 8, 3)),
                      (True, 4096, (64, 64, 4, 3)), (False, 8192, (128, 64, 8, 3)), (True, 8192, (128, 64, 8, 3)))
] + [
    ("_bwd_dkdv_kernel", dt, 128, c, n, *cfg)
    for dt in ("bfloat16", "float16")
    for c, n, cfg in ((False, 4096, (64, 64, 4, 2)), (True, 4096, (64, 64, 4, 2)),
                      (False, 8192, (64, 64, 4, 2)), (True, 8192, (128, 128, 8, 2)))
] + [
    ("_bwd_dq_kernel", dt, 128, c, n, *cfg)
    for dt in ("bfloat16", "float16")
    for c, n, cfg in ((False, 4096, (128, 128, 8, 2)), (True, 4096, (64, 64, 4, 2)),
                      (False, 8192, (128, 128, 8, 2)), (True, 8192, (64, 64, 4, 2)))
] + [  # d 64, bf16 (tuned in a second run the same day)
    ("_attn_fwd_kernel", "bfloat16", 64, c, n, *cfg)
    for c, n, cfg in ((False, 4096, (128, 64, 8, 3)), (True, 4096, (64, 64, 4, 3)),
                      (False, 8192, (128, 64, 8, 3)), (True, 8192, (128, 64, 8, 3)))
] + [
    (kernel, "bfloat16", 64, c, n, *cfg)
    for kernel, cfg in (("_bwd_dkdv_kernel", (32, 128, 4, 2)), ("_bwd_dq_kernel", (64, 64, 4, 2)))
    for c in (False, True) for n in (4096, 8192)
] + [  # the 2k class, bf16 (``tune --lengths 2048 --head-dims 64,128``, the same day; served by the 4k
    # rows before: the portable forward at d 128 non-causal 2k ran at 0.92 of autotuned)
    (kernel, "bfloat16", d, c, 2048, *cfg)
    for kernel, d, c, cfg in (
        ("_attn_fwd_kernel", 64, False, (128, 64, 8, 3)), ("_attn_fwd_kernel", 64, True, (64, 64, 4, 3)),
        ("_attn_fwd_kernel", 128, False, (64, 64, 4, 3)), ("_attn_fwd_kernel", 128, True, (64, 64, 4, 3)),
        ("_bwd_dkdv_kernel", 64, False, (32, 128, 4, 2)), ("_bwd_dkdv_kernel", 64, True, (32, 64, 4, 3)),
        ("_bwd_dkdv_kernel", 128, False, (64, 64, 4, 2)), ("_bwd_dkdv_kernel", 128, True, (64, 64, 4, 2)),
        *(("_bwd_dq_kernel", d, c, (64, 64, 4, 2)) for d in (64, 128) for c in (False, True)))
]

# The backwards of causal attention with an option (``flashattn-lite tune --ops variants``, d 128 bf16,
# N 8k: softcap 30, ALiBi, both, a 4k-key window). The forwards of these calls take the Hopper kernels
# on sm_90 (Gluon, or TMA for windows and short causal calls). fp16 takes bf16's rows, as it picked them
# for the plain backwards.
_TUNED_VARIANTS = "flashattn-lite tune --ops variants on the H100, triton 3.6, 2026-11-24 (d 128 bf16, N 8k)"
_VARIANT_ROWS = [  # (kernel, option flags, BLOCK_M, BLOCK_N, warps, stages)
    ("_bwd_dkdv_kernel", {"SOFTCAP": True}, 64, 128, 8, 2),
    ("_bwd_dkdv_kernel", {"ALIBI": True}, 64, 128, 8, 2),
    ("_bwd_dkdv_kernel", {"SOFTCAP": True, "ALIBI": True}, 64, 128, 8, 3),
    ("_bwd_dkdv_kernel", {"HAS_LEFT": True}, 64, 128, 8, 2),
    ("_bwd_dq_kernel", {"SOFTCAP": True}, 64, 64, 4, 2),
    ("_bwd_dq_kernel", {"ALIBI": True}, 128, 128, 8, 2),
    ("_bwd_dq_kernel", {"SOFTCAP": True, "ALIBI": True}, 64, 64, 4, 2),
    ("_bwd_dq_kernel", {"HAS_LEFT": True}, 128, 128, 8, 2),
]


def _variants(kernel):
    return [_attn(128, True, bm, bn, w, s, _TUNED_VARIANTS, dtype=dt, n_bucket=8192, GROUP=1, **flags)
            for name, flags, bm, bn, w, s in _VARIANT_ROWS if name == kernel
            for dt in ("bfloat16", "float16")]


def _tuned(kernel):
    group = {} if kernel == "_attn_fwd_kernel" else {"GROUP": 1}
    return [_attn(d, c, bm, bn, w, s, _TUNED, dtype=dt, n_bucket=n, **group)
            for name, dt, d, c, n, bm, bn, w, s in _TUNED_ROWS if name == kernel]


TABLE = {
    "arch": "sm90",
    "kernels": {
        "_decode_split_kernel": [
            _decode(256, 64, 4, 3),                     # B 1, 4k (16 splits)
            _decode(2048, 64, 4, 3),                    # B 1, 32k; B 8, 4k
            _decode(8192, 64, 4, 3),                    # B 1, 128k
            _decode(16384, 64, 4, 3),                   # B 8, 32k (2 splits)
            _decode(2048, 128, 4, 2, page_size=256),    # B 1, 32k, pages of 256
            # Pages of 16 (vLLM's default): autotuned the same at every length class of
            # ``decode --quick`` (table_check-20261124-103813.json: without these rows the first
            # fitting config ran at 0.71–0.78× the autotuned speed).
            *(_decode(bucket, 128, 4, 2, page_size=16) for bucket in (256, 2048, 8192, 16384, 65536)),
        ],
        # Tuned rows (with a length class) first; the older rows (no length) serve d 64 calls the
        # tuning run did not reach.
        "_attn_fwd_kernel": _tuned("_attn_fwd_kernel") + [_attn(d, c, 128, 64, 8, 3, _ATTN_RUN1)
                                                          for d in (64, 128) for c in (False, True)],
        # dK/dV: "64×128" recorded without warps/stages; (8, 2) is the first of that shape that fits.
        "_bwd_dkdv_kernel": _tuned("_bwd_dkdv_kernel") + _variants("_bwd_dkdv_kernel") + [
            _attn(d, c, 64, 128, 8, 2, "NOTES.md run 1 (64x128; warps/stages: first fit)", GROUP=1)
            for d in (64, 128) for c in (False, True)],
        "_bwd_dq_kernel": _tuned("_bwd_dq_kernel") + _variants("_bwd_dq_kernel"),
    },
}
