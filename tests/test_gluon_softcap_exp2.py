"""The Gluon forward's softcap exp2, part of it on the FMA pipe (ops/attention_fwd_gluon.py:
``exp2_mixed_asm``), checked without a GPU: its PTX is run by a small float32 interpreter (numpy;
``ex2.approx.ftz.f32`` as the exact 2^x flushed below 2^-126, the MUFU op's model) over the
exponents a softcap call makes, x = c·log2 e·(tanh − max) ∈ [−2c·log2 e, 0] for c in {5, 30, 50},
plus −inf (masked keys), NaN and the clamp's edge. Then one softmax row per (c, dtype): the mixed
exp2 moves o and lse by far less than the tolerances of tests/test_attention_gluon_variants.py
(o: 2·torch's error + 2e-3 fp16 / 1.5e-2 bf16, relative; lse: 2e-2 absolute).

The kernel itself needs an sm_90 GPU: tests/test_attention_gluon_variants.py -k softcap."""
import re

import numpy as np
import pytest
import torch

from flashattn_lite.ops import attention_fwd_gluon as g

LOG2E = 1.4426950408889634
# The polynomial's relative error (≤ 7.5e-5, float32 coefficients), plus a few float32 roundings.
BOUND = 8e-5
PACK = 8


def _bits(v):
    return np.asarray(v, dtype=np.float32).view(np.uint32)


def _f32(b):
    return np.asarray(b, dtype=np.uint32).view(np.float32)


def run_ptx(asm: str, xs: np.ndarray) -> np.ndarray:
    """Run ``exp2_mixed_asm``'s PTX on xs (PACK, n) float32: the outputs $0..$7, (PACK, n)."""
    regs = {f"${PACK + i}": _bits(xs[i]) for i in range(PACK)}

    def val(tok):
        if tok.startswith("0f"):
            return np.uint32(int(tok[2:], 16))
        if re.fullmatch(r"\d+", tok):
            return np.uint64(int(tok))
        return regs[tok]

    with np.errstate(all="ignore"):
        for line in asm.splitlines():
            line = line.strip().rstrip(";")
            if line in ("{", "}") or line.startswith(".reg"):
                continue
            opcode, rest = line.split(None, 1)
            d, *src = [t.strip() for t in rest.split(",")]
            a = [val(t) for t in src]
            f = [_f32(x) for x in a] if not opcode.startswith(("mad", "mov")) else None
            if opcode == "ex2.approx.ftz.f32":
                r = np.exp2(f[0].astype(np.float64))
                r = np.where(r < 2.0 ** -126, 0.0, r).astype(np.float32)
            elif opcode == "max.NaN.f32":
                r = np.where(np.isnan(f[0]) | np.isnan(f[1]), np.float32("nan"), np.maximum(f[0], f[1]))
            elif opcode == "add.rn.f32":
                r = f[0] + f[1]
            elif opcode == "sub.rn.f32":
                r = f[0] - f[1]
            elif opcode == "mul.rn.f32":
                r = f[0] * f[1]
            elif opcode == "fma.rn.f32":  # the product is exact in float64; one rounding of the sum
                r = (f[0].astype(np.float64) * f[1] + f[2]).astype(np.float32)
            elif opcode == "mov.b32":
                r = a[0]
            elif opcode == "mad.lo.u32":
                r = ((a[0].astype(np.uint64) * a[1] + a[2]) & 0xFFFFFFFF).astype(np.uint32)
            else:
                raise AssertionError(f"unexpected PTX: {line}")
            regs[d] = _bits(r) if r.dtype == np.float32 else np.asarray(r, dtype=np.uint32)
    return np.stack([_f32(regs[f"${i}"]) for i in range(PACK)])


def mixed_exp2(x: np.ndarray) -> np.ndarray:
    """exp2 of a float32 array as the kernel computes it: consecutive groups of 8 through the PTX."""
    flat = x.astype(np.float32).reshape(-1, PACK).T
    return run_ptx(g.exp2_mixed_asm(), flat).T.reshape(x.shape)


def test_the_emulated_lanes():
    lanes = g.exp2_emulated_lanes()
    assert len(lanes) == g.EXP2_EMULATED and 0 < g.EXP2_EMULATED < PACK and lanes == sorted(set(lanes))
    asm = g.exp2_mixed_asm()
    assert asm.count("max.NaN.f32") == g.EXP2_EMULATED
    assert asm.count("ex2.approx.ftz.f32") == PACK - g.EXP2_EMULATED
    for i in range(PACK):  # each output written once
        assert len(re.findall(rf"\s\${i},", asm)) == 1
    assert g.EXP2_MIXED_CONSTRAINTS.value.split(",") == ["=f"] * PACK + ["f"] * PACK


@pytest.mark.parametrize("cap", [5.0, 30.0, 50.0])
def test_exp2_over_a_softcap_range(cap):
    # Every exponent a softcap row can make (and a little above 0: the max's rounding), on the
    # emulated lanes and on the MUFU ones: relative error ≤ BOUND where 2^x is a normal float,
    # and below 2^-126 no more than 2^-126 (the MUFU op flushes those to 0, the FMA path from −127).
    lo = -2 * cap * LOG2E
    x = np.concatenate([np.linspace(lo, 1e-5, (1 << 17) - 64).astype(np.float32),
                        np.float32(-127.0) + np.arange(-32, 32, dtype=np.float32) / 16])
    x = x[: x.size // PACK * PACK]
    got = mixed_exp2(x).astype(np.float64)
    exact = np.exp2(x.astype(np.float64))
    normal = exact >= 2.0 ** -126
    rel = np.abs(got[normal] / exact[normal] - 1)
    assert rel.max() <= BOUND, rel.max()
    assert (got[~normal] >= 0).all() and (got[~normal] <= 2.0 ** -126).all()
    rel_lanes = np.abs(got / np.where(exact > 0, exact, 1) - 1).reshape(-1, PACK)[:, g.exp2_emulated_lanes()]
    # the FMA lanes are the ones that carry the polynomial's error (the MUFU model is exact)
    assert rel_lanes[normal.reshape(-1, PACK)[:, g.exp2_emulated_lanes()]].max() > 1e-6


def test_special_values():
    x = np.array([-np.inf, np.nan, -127.0, -127.25, -1000.0, 0.0, 1e-7, -0.5] * PACK, np.float32)
    got = mixed_exp2(x.reshape(PACK, PACK).T.copy()).T.reshape(-1)  # each value on every lane
    v = got.reshape(PACK, PACK)
    assert (v[:, 0] == 0).all() and not np.signbit(v[:, 0]).any()  # a masked key: exactly +0
    assert np.isnan(v[:, 1]).all()                                  # NaN stays NaN
    assert (v[:, 2] <= 2.0 ** -126).all() and (v[:, 3] == 0).all() and (v[:, 4] == 0).all()
    assert np.allclose(v[:, 5], 1, rtol=BOUND, atol=0) and np.allclose(v[:, 6], 1, rtol=BOUND, atol=0)
    assert np.allclose(v[:, 7], 2 ** -0.5, rtol=BOUND, atol=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("cap", [5.0, 30.0, 50.0])
def test_softmax_row_within_tolerance(cap, dtype):
    # Rows of softcapped logits (a few near the cap, most far below), P rounded to the dtype for P·V
    # and the row sum in float32 as in the kernel: the mixed exp2 against the MUFU model moves o by
    # < 10% of the dtype's test eps (fp16 ~5%: P's roundings flip) and lse by ≤ BOUND (0.4% of its
    # 2e-2 tolerance).
    rng = np.random.default_rng(0)
    n, d = 4096, 64
    z = rng.standard_normal((16, n)) * cap * np.array([0.3, 1, 3, 10] * 4)[:, None]
    z[:, :5] = 4 * cap
    fold = np.float32(cap * LOG2E)
    t = np.tanh(z / cap).astype(np.float32)
    m = t.max(1, keepdims=True) * fold
    x = (t * fold - m).astype(np.float32)
    v = rng.standard_normal((n, d))
    outs = []
    for p in (mixed_exp2(x), run_ptx(_all_mufu(), x.reshape(-1, PACK).T).T.reshape(x.shape)):
        l = p.sum(1, dtype=np.float32).astype(np.float64)
        pv = torch.from_numpy(p).to(dtype).double().numpy() @ v
        outs.append((pv / l[:, None], (m[:, 0] + np.log2(l)) / LOG2E))
    (o, lse), (o_ref, lse_ref) = outs
    eps = {torch.float16: 2e-3, torch.bfloat16: 1.5e-2}[dtype]
    assert np.linalg.norm(o - o_ref) / np.linalg.norm(o_ref) < 0.1 * eps
    assert np.abs(lse - lse_ref).max() <= BOUND


def _all_mufu() -> str:
    return "\n".join(f"ex2.approx.ftz.f32 ${i}, ${PACK + i};" for i in range(PACK))
