"""CPU (float64) emulation of ``_attn_bwd_gluon_mla_kernel`` (MLA's 128-key programs) and its host side.

Each program runs as three Python generators (loader warp, consumer 0, consumer 1) under a random
scheduler that models the mbarriers (count, phase parity, ``wait(bar, p)`` passing once the phase of
parity p completed; a fresh barrier's parity-1 phase counts as complete), the asynchronous TMA loads
(data land at a random later point, then the barrier's phase completes), the asynchronous wgmmas
(operands read at a random point between issue and ``warpgroup_mma_wait``; groups retire in order)
and the TMA reduce-adds (the staging buffer read at a random point before ``tma.store_wait``). A
race on a shared buffer then shows as a wrong result in some interleavings; a protocol error as a
deadlock or a phase mismatch. The arithmetic follows the kernel as written: Sᵀ, Pᵀ = exp2(Sᵀ·scale·log2e
− lse₂), the masks as coded, P through the dS buffer, dPᵀ − δ, dV, dSᵀ, dK, dQ blocks dealt
(it + j) mod 2, the masked register stores. lse₂ / δ as ``_row_stats`` pads them (+inf / 0).

Usage: python benchmarks/experiments/mla_128_emulate.py [--repo CHECKOUT_WITH_THE_PATCH] [--quick] [--seeds N]
"""
from __future__ import annotations

import argparse
import random
import sys

import numpy as np
import torch

LOG2E = 1.4426950408889634
MUTATION = None  # a deliberately broken protocol step, to show the scheduler catches it (``--mutations``)
KC, CH, DV, BLOCK_M, STAGES, DS_BUFS = 3, 64, 128, 64, 2, 2


# ----------------------------------------------------------------------------- host-side helpers (Python copies)

def cdiv(a, b):
    return -(-a // b)


def query_tiles(start_n, n_q, off, BLOCK_M, BLOCK_N):
    """``attention_bwd_gluon.query_tiles``, causal, no window."""
    q_end = cdiv(n_q, BLOCK_M) * BLOCK_M
    lo = min((max(start_n - off, 0) // BLOCK_M) * BLOCK_M, q_end)
    mid_lo = min(cdiv(max(start_n + BLOCK_N - 1 - off, 0), BLOCK_M) * BLOCK_M, q_end)
    n_tiles = (q_end - lo) // BLOCK_M
    return lo, n_tiles, mid_lo, q_end


def banded_key_tile(pid, n_programs, n_key_tiles, band, banded_heads):
    n_heads = n_programs // n_key_tiles
    plain = (n_heads - banded_heads) * n_key_tiles
    bh, tile = pid // n_key_tiles, pid % n_key_tiles
    if pid >= plain:
        p = pid - plain
        per_band = band * banded_heads
        band_start = p // per_band * band
        width = min(band, n_key_tiles - band_start)
        r = p % per_band
        bh = n_heads - banded_heads + r // width
        tile = band_start + r % width
    return bh, tile


def query_tile(it, n_tiles, lo, h_kv, GROUP):
    """``_query_tile`` without rotation."""
    if GROUP == 1:
        g, i = 0, it
    else:
        g, i = it // n_tiles, it % n_tiles
    return h_kv * GROUP + g, lo + i * BLOCK_M


def box(t, coord, shape):
    """A TMA load: the box of ``shape`` at ``coord`` of tensor ``t`` (numpy), zeros out of bounds."""
    out = np.zeros(shape)
    src = []
    dst = []
    for c, n, dim in zip(coord, shape, t.shape):
        a, b = max(c, 0), min(c + n, dim)
        if b <= a:
            return out
        src.append(slice(a, b))
        dst.append(slice(a - c, b - c))
    out[tuple(dst)] = t[tuple(src)]
    return out


def reduce_box(t, coord, x):
    """A TMA reduce-add of ``x`` into ``t`` at ``coord`` (out of bounds dropped)."""
    src, dst = [], []
    for c, n, dim in zip(coord, x.shape, t.shape):
        a, b = max(c, 0), min(c + n, dim)
        if b <= a:
            return
        dst.append(slice(a, b))
        src.append(slice(a - c, b - c))
    t[tuple(dst)] += x[tuple(src)]


# ----------------------------------------------------------------------------- the machine model

class Barrier:
    def __init__(self, count, name):
        self.count, self.name = count, name
        self.pending = count  # arrivals left in the current phase
        self.tx = 0
        self.phase = 0  # the phase in progress (its parity is phase & 1)

    def arrive(self, n=1):
        self.pending -= n
        assert self.pending >= 0, f"{self.name}: too many arrivals in phase {self.phase}"
        self._maybe_flip()

    def expect(self, nbytes):  # mbarrier.expect: an arrival with a transaction count
        self.tx += nbytes
        self.arrive()

    def complete_tx(self, nbytes):
        self.tx -= nbytes
        assert self.tx >= 0, self.name
        self._maybe_flip()

    def _maybe_flip(self):
        if self.pending == 0 and self.tx == 0:
            self.phase += 1
            self.pending = self.count

    def passed(self, parity):
        """mbarrier.wait(bar, parity) returns: the phase of that parity completed (the current phase's
        parity differs)."""
        return (self.phase & 1) != parity


class Deadlock(Exception):
    pass


class Program:
    """One program's shared memory, barriers and partitions."""

    def __init__(self, env, pid, rng, lazy=True):
        self.env, self.rng, self.lazy = env, rng, lazy
        e = env
        n_key_tiles = cdiv(e.n_k, 128)
        bh_kv, tile = banded_key_tile(pid, e.grid, n_key_tiles, e.band, e.banded_heads)
        self.tile_id = (bh_kv, tile)
        self.b, self.h_kv = bh_kv // e.n_kv_heads, bh_kv % e.n_kv_heads
        self.start_n = tile * 128
        self.off = e.n_k - e.n_q
        self.lo, self.n_tiles, self.mid_lo, _ = query_tiles(self.start_n, e.n_q, self.off, BLOCK_M, 128)
        self.q_smem = [None] * (STAGES * KC)
        self.do_smem = [None] * STAGES
        self.k_smem = [None] * (2 * KC)
        self.v_smem = [None] * 2
        self.lse_smem = [None] * STAGES
        self.delta_smem = [None] * STAGES
        self.ds_smem = [np.full((BLOCK_M, 64), np.nan) for _ in range(DS_BUFS * 2)]
        self.dq_stage = [np.full((BLOCK_M, CH), np.nan) for _ in range(2)]
        self.kv_bar = Barrier(1, "kv_bar")
        self.ready = [Barrier(1, f"ready{s}") for s in range(STAGES)]
        self.empty = [Barrier(2, f"empty{s}") for s in range(STAGES)]
        self.ds_ready = [Barrier(2, f"ds_ready{i}") for i in range(DS_BUFS)]
        self.ds_free = [Barrier(2, f"ds_free{i}") for i in range(DS_BUFS)]
        self.tma_loads = []  # pending (write, barrier, nbytes)
        self.wgmma = {0: [], 1: []}  # pending per consumer, in issue order
        self.reduces = {0: [], 1: []}  # pending TMA reduce-adds per consumer

    # --- async machinery
    def issue_load(self, write, bar, nbytes):
        self.tma_loads.append((write, bar, nbytes))

    def issue_mma(self, me, fn):
        """fn() computes the result reading shared memory at the time it runs. Returns a future."""
        fut = {"fn": fn}
        if self.lazy:
            self.wgmma[me].append(fut)
        else:
            fut["value"] = fn()
        return fut

    def retire_oldest(self, me):
        fut = self.wgmma[me].pop(0)
        fut["value"] = fut["fn"]()

    def mma_wait(self, me, n):
        """warpgroup_mma_wait(n): at most n groups pending; a generator step."""
        while len(self.wgmma[me]) > n:
            if self.rng.random() < 0.5:
                yield ("yield",)
            if len(self.wgmma[me]) > n:
                self.retire_oldest(me)

    def issue_reduce(self, me, coord, stage_idx):
        def fire():
            reduce_box(self.env.dq_acc, coord, self.dq_stage[stage_idx].copy()[None, None])
        if self.lazy:
            self.reduces[me].append(fire)
        else:
            fire()

    def store_wait(self, me):
        while self.reduces[me]:
            if self.rng.random() < 0.5:
                yield ("yield",)
            if self.reduces[me]:
                self.reduces[me].pop(0)()

    def wait_bar(self, bar, parity):
        while not bar.passed(parity):
            yield ("block", bar, parity)

    # --- partitions
    def loader(self):
        e, b, h_kv, sn = self.env, self.b, self.h_kv, self.start_n
        kv_bytes = 2 * (KC * 64 * 64 * 2 + 64 * 128 * 2)
        self.kv_bar.expect(kv_bytes)
        for c in range(2):
            for j in range(KC):
                idx = c * KC + j
                data = box(e.k, (b, h_kv, sn + 64 * c, CH * j), (1, 1, 64, CH))[0, 0]
                self.issue_load(lambda idx=idx, d=data: self.k_smem.__setitem__(idx, d), self.kv_bar,
                                64 * 64 * 2)
            data = box(e.v, (b, h_kv, sn + 64 * c, 0), (1, 1, 64, DV))[0, 0]
            self.issue_load(lambda c=c, d=data: self.v_smem.__setitem__(c, d), self.kv_bar, 64 * 128 * 2)
        step_bytes = KC * BLOCK_M * CH * 2 + BLOCK_M * DV * 2 + BLOCK_M * 4 * 2
        for it in range(e.GROUP * self.n_tiles):
            s = it % STAGES
            yield from self.wait_bar(self.empty[s], ((it // STAGES) & 1) ^ 1)
            h, start_m = query_tile(it, self.n_tiles, self.lo, h_kv, e.GROUP)
            bar = self.ready[s]
            bar.expect(step_bytes)
            for j in range(KC):
                data = box(e.q, (b, h, start_m, CH * j), (1, 1, BLOCK_M, CH))[0, 0]
                self.issue_load(lambda i=s * KC + j, d=data: self.q_smem.__setitem__(i, d), bar,
                                BLOCK_M * CH * 2)
            data = box(e.do, (b, h, start_m, 0), (1, 1, BLOCK_M, DV))[0, 0]
            self.issue_load(lambda d=data, s=s: self.do_smem.__setitem__(s, d), bar, BLOCK_M * DV * 2)
            for arr, name in ((e.lse2_pad, "lse_smem"), (e.delta_pad, "delta_smem")):
                data = box(arr, (b * e.n_heads + h, start_m), (1, BLOCK_M))[0]
                self.issue_load(lambda d=data, s=s, name=name: getattr(self, name).__setitem__(s, d), bar,
                                BLOCK_M * 4)
            self.loader_steps.append((h, start_m))

    def masked(self, pt, keys, start_m):
        e = self.env
        rows = start_m + np.arange(BLOCK_M)
        visible = (keys < e.n_k)[:, None] & (keys[:, None] <= (rows + self.off)[None, :])
        return np.where(visible, pt, 0.0)

    def consumer(self, ME):
        e = self.env
        rnd = e.round16
        keys = self.start_n + 64 * ME + np.arange(64)
        tail = self.start_n + 64 * (ME + 1) > e.n_k
        dk = [np.zeros((64, CH)) for _ in range(KC)]
        dv = np.zeros((64, DV))
        yield from self.wait_bar(self.kv_bar, 0)
        steps = []
        for it in range(e.GROUP * self.n_tiles):
            s = it % STAGES
            h, start_m = query_tile(it, self.n_tiles, self.lo, self.h_kv, e.GROUP)
            steps.append((h, start_m))
            yield from self.wait_bar(self.ready[s], (it // STAGES) & 1)
            qi = [s * KC + j for j in range(KC)]
            st = self.issue_mma(ME, lambda qi=qi: sum(self.k_smem[ME * KC + j] @ self.q_smem[qi[j]].T
                                                      for j in range(KC)))
            lse2 = self.lse_smem[s][None, :].copy()
            yield from self.mma_wait(ME, 0)
            with np.errstate(invalid="ignore", over="ignore"):
                pt = np.exp2(st["value"] * e.qk_scale - lse2)
            if (start_m < self.mid_lo) or tail:
                pt = self.masked(pt, keys, start_m)
            ds_buf, use = it % DS_BUFS, it // DS_BUFS
            me_idx = ds_buf * 2 + ME
            if MUTATION != "no-ds-free-wait":
                yield from self.wait_bar(self.ds_free[ds_buf], (use & 1) ^ 1)
            self.ds_smem[me_idx] = rnd(pt).T.copy()
            delta = self.delta_smem[s][None, :].copy()
            dpt = self.issue_mma(ME, lambda s=s, delta=delta: self.v_smem[ME] @ self.do_smem[s].T - delta)
            dv_prev = dv
            dvf = self.issue_mma(ME, lambda s=s, m=me_idx, a=dv_prev: self.ds_smem[m].T @ self.do_smem[s] + a)
            yield from self.mma_wait(ME, 1)
            dst = rnd(self.ds_smem[me_idx].T.copy() * dpt["value"])
            dkf = [self.issue_mma(ME, lambda j=j, a=dk[j], s=s, d=dst: d @ self.q_smem[s * KC + j] + a)
                   for j in range(KC)]
            yield from self.mma_wait(ME, 4 if MUTATION == "ds-over-p-early" else 3)
            if MUTATION == "ds-over-p-early":
                self.ds_smem[me_idx] = dst.T.copy()
            yield from self.mma_wait(ME, 3)
            dv = dvf["value"]
            self.ds_smem[me_idx] = dst.T.copy()
            self.ds_ready[ds_buf].arrive()
            if MUTATION == "empty-early":
                self.empty[s].arrive()
            yield from self.mma_wait(ME, 0)
            dk = [f["value"] for f in dkf]
            if MUTATION != "empty-early":
                self.empty[s].arrive()
            yield from self.wait_bar(self.ds_ready[ds_buf], use & 1)
            j1 = (it + ME) % 2 if MUTATION != "same-blocks" else it % 2
            blocks = [j1] + ([j1 + 2] if j1 == 0 else [])
            for j in blocks:
                dqf = self.issue_mma(ME, lambda j=j, d=ds_buf: self.ds_smem[d * 2] @ self.k_smem[j]
                                     + self.ds_smem[d * 2 + 1] @ self.k_smem[KC + j])
                yield from self.mma_wait(ME, 0)
                if MUTATION != "no-store-wait":
                    yield from self.store_wait(ME)
                self.dq_stage[ME] = dqf["value"] * e.sm_scale
                self.issue_reduce(ME, (self.b, h, start_m, CH * j), ME)
                self.dq_blocks.append((it, h, start_m, j, ME))
            self.ds_free[ds_buf].arrive()
        yield from self.store_wait(ME)
        first = self.start_n + 64 * ME
        rows = first + np.arange(64)
        ok = rows < e.n_k
        for j in range(KC):
            e.dk_out[self.b, self.h_kv, rows[ok], CH * j:CH * (j + 1)] = rnd(dk[j][ok] * e.sm_scale)
        e.dv_out[self.b, self.h_kv, rows[ok], :] = rnd(dv[ok])
        self.consumer_steps[ME] = steps

    def run(self):
        self.loader_steps, self.consumer_steps, self.dq_blocks = [], {}, []
        actors = {"loader": self.loader(), "c0": self.consumer(0), "c1": self.consumer(1)}
        blocked = {name: None for name in actors}
        while actors:
            choices = []
            for name in actors:
                cond = blocked[name]
                if cond is None or cond[1].passed(cond[2]):
                    choices.append(("actor", name))
            if self.tma_loads:
                choices.append(("load", None))
            if self.lazy:
                for me in (0, 1):
                    if self.wgmma[me]:
                        choices.append(("mma", me))
                    if self.reduces[me]:
                        choices.append(("reduce", me))
            if not choices:
                stuck = [(n, c[1].name, c[2]) for n, c in blocked.items() if c]
                raise Deadlock(f"program {self.tile_id}: blocked {stuck}")
            kind, who = self.rng.choice(choices)
            if kind == "actor":
                blocked[who] = None
                try:
                    ev = next(actors[who])
                except StopIteration:
                    del actors[who]
                    del blocked[who]
                    continue
                if ev[0] == "block":
                    blocked[who] = ev
            elif kind == "load":
                i = self.rng.randrange(len(self.tma_loads))
                write, bar, nbytes = self.tma_loads.pop(i)
                write()
                bar.complete_tx(nbytes)
            elif kind == "mma":
                self.retire_oldest(who)
            else:
                self.reduces[who].pop(0)()
        assert not self.tma_loads and not any(self.wgmma.values()) and not any(self.reduces.values())
        assert self.consumer_steps[0] == self.consumer_steps[1] == self.loader_steps, "step sequences differ"
        # every step of the program: blocks 0, 1, 2 once each
        got = sorted((it, j) for it, _, _, j, _ in self.dq_blocks)
        want = sorted((it, j) for it in range(self.env.GROUP * self.n_tiles) for j in range(KC))
        assert got == want, "dQ blocks not dealt once each"


class Env:
    pass


def round_to(dtype):
    if dtype is None:
        return lambda x: x

    def rnd(x):
        return torch.from_numpy(np.ascontiguousarray(x)).to(dtype).double().numpy()
    return rnd


def kernel_call(q, k, v, do, lse2_pad, delta_pad, dq_acc, dk_out, dv_out, scale, sms=132, seed=0, lazy=True,
                round16=None, launch_order=None):
    """One launch of the kernel as ``mla_launch`` sets it up (tensors as numpy float64)."""
    e = Env()
    e.q, e.k, e.v, e.do = q, k, v, do
    e.lse2_pad, e.delta_pad, e.dq_acc, e.dk_out, e.dv_out = lse2_pad, delta_pad, dq_acc, dk_out, dv_out
    B, Hq, Nq, _ = q.shape
    e.n_heads, e.n_kv_heads, e.n_q, e.n_k = Hq, k.shape[1], Nq, k.shape[2]
    e.GROUP = Hq // k.shape[1]
    n_key_tiles = cdiv(e.n_k, 128)
    e.grid = n_key_tiles * B * e.n_kv_heads
    e.band, e.banded_heads = launch_order(n_key_tiles, B * e.n_kv_heads, e.GROUP, sms)
    e.qk_scale, e.sm_scale = scale * LOG2E, scale
    e.round16 = round_to(round16)
    rng = random.Random(seed)
    seen = set()
    for pid in range(e.grid):
        p = Program(e, pid, rng, lazy)
        assert p.tile_id not in seen, f"tile {p.tile_id} twice"
        seen.add(p.tile_id)
        p.run()
    assert len(seen) == e.grid


def row_stats(o, do, lse, n_pad):
    """``_row_stats``: δ = rowsum(dO∘O), lse₂ = lse·log2e (+inf where −inf), padded with δ 0, lse₂ +inf."""
    B, Hq, Nq, _ = o.shape
    delta = (o * do).sum(-1)
    lse2 = np.where(np.isneginf(lse), np.inf, lse * LOG2E)
    delta_pad = np.zeros((B * Hq, n_pad))
    lse2_pad = np.full((B * Hq, n_pad), np.inf)
    delta_pad[:, :Nq] = delta.reshape(B * Hq, Nq)
    lse2_pad[:, :Nq] = lse2.reshape(B * Hq, Nq)
    return delta_pad, lse2_pad


def host_backward(q, k, v, do, o, lse, scale, g, dq_buffer_bytes=None, **kw):
    """``attention_backward_gluon`` with the mla config, over numpy float64 tensors: the chunks
    (``dq_buffer_chunks``), each chunk's row statistics, buffer, launch and conversion."""
    B, Hq, Nq, _ = q.shape
    Hkv = k.shape[1]
    old = g.DQ_BUFFER_BYTES
    if dq_buffer_bytes is not None:
        g.DQ_BUFFER_BYTES = dq_buffer_bytes
    try:
        chunks = g.dq_buffer_chunks(B, Hq, Hkv, Nq, 192)
    finally:
        g.DQ_BUFFER_BYTES = old
    dq, dk, dv = np.full(q.shape, np.nan), np.full(k.shape, np.nan), np.full(v.shape, np.nan)
    group = Hq // Hkv
    for rows, kv in chunks:
        heads = slice(kv.start * group, kv.stop * group) if kv.start is not None else slice(None)
        qc, kc, vc, doc, oc = q[rows, heads], k[rows, kv], v[rows, kv], do[rows, heads], o[rows, heads]
        lc = lse[rows, heads]
        n_pad = cdiv(Nq, 128) * 128
        delta_pad, lse2_pad = row_stats(oc, doc, lc, n_pad)
        acc = np.zeros((*qc.shape[:3], 192))
        dk_c, dv_c = np.full(kc.shape, np.nan), np.full(vc.shape, np.nan)
        kernel_call(qc, kc, vc, doc, lse2_pad, delta_pad, acc, dk_c, dv_c, scale, launch_order=g.launch_order, **kw)
        dq[rows, heads] = acc
        dk[rows, kv] = dk_c
        dv[rows, kv] = dv_c
    return dq, dk, dv, len(chunks)


def reference(q, k, v, do, scale, ref_mod):
    leaves = [torch.from_numpy(t).requires_grad_() for t in (q, k, v)]
    o, lse = ref_mod.attention_reference(*leaves, causal=True, scale=scale)
    grads = torch.autograd.grad(o, leaves, torch.from_numpy(do))
    return o.detach().numpy(), lse.detach().numpy(), [x.numpy() for x in grads]


def check(shape, seed=0, sched_seed=0, dq_buffer_bytes=None, lazy=True, round16=None, repo=None, quiet=False):
    sys.path.insert(0, repo)
    from flashattn_lite import reference as ref_mod
    from flashattn_lite.ops import attention_bwd_gluon as g
    B, Hq, Hkv, Nq, Nk = shape
    rs = np.random.default_rng(seed)
    q = rs.standard_normal((B, Hq, Nq, 192))
    k = rs.standard_normal((B, Hkv, Nk, 192))
    v = rs.standard_normal((B, Hkv, Nk, 128))
    do = rs.standard_normal((B, Hq, Nq, 128))
    scale = 192 ** -0.5
    o, lse, ref = reference(q, k, v, do, scale, ref_mod)
    dq, dk, dv, n_chunks = host_backward(q, k, v, do, o, lse, scale, g, dq_buffer_bytes, seed=sched_seed, lazy=lazy,
                                         round16=round16)
    errs = {}
    for name, a, r in zip(("dq", "dk", "dv"), (dq, dk, dv), ref):
        if not np.isfinite(a).all():
            errs[name] = float("nan")
        else:
            errs[name] = float(np.linalg.norm(a - r) / max(np.linalg.norm(r), 1e-30))
    ok = all(e < (1e-10 if round16 is None else 2e-2) for e in errs.values())
    if not quiet or not ok:
        print(f"{'ok ' if ok else 'BAD'} shape {shape} chunks {n_chunks} sched {sched_seed} lazy {lazy}: "
              + ", ".join(f"{n} {e:.2e}" for n, e in errs.items()), flush=True)
    return ok, (dq, dk, dv), ref


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repo", default=".")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--mutations", action="store_true", help="check that broken protocols are caught")
    args = ap.parse_args()
    if args.mutations:
        global MUTATION
        for MUTATION in ("no-ds-free-wait", "ds-over-p-early", "empty-early", "no-store-wait", "same-blocks"):
            caught = 0
            for sched in range(4):
                try:
                    ok, _, _ = check((1, 2, 1, 300, 300), sched_seed=sched, repo=args.repo, quiet=True)
                except (AssertionError, Deadlock) as e:
                    ok = False
                    print("  ", MUTATION, type(e).__name__, str(e)[:80])
                caught += not ok
            print(f"mutation {MUTATION}: caught in {caught} of 4 schedules", flush=True)
        return
    shapes = [(1, 2, 2, 64, 64), (1, 2, 2, 129, 129), (1, 2, 1, 1000, 1000), (1, 2, 1, 1000, 1337),
              (2, 2, 1, 17, 17), (2, 4, 2, 17, 17), (1, 1, 1, 4097, 1000), (1, 2, 2, 4097, 1000), (1, 1, 1, 200, 70),
              (1, 2, 1, 1000, 4097), (1, 1, 1, 4097, 4097)]
    if args.quick:
        shapes = shapes[:6]
    bad = 0
    for shape in shapes:
        for sched in range(args.seeds):
            ok, _, _ = check(shape, sched_seed=sched, repo=args.repo)
            bad += not ok
    # the chunked test's call: B 1, Hq 6, Hkv 3, 1000 x 1337, buffer capped to one KV head's rows
    for sched in range(args.seeds):
        ok, _, _ = check((1, 6, 3, 1000, 1337), sched_seed=sched, dq_buffer_bytes=1 * 2 * 1000 * 192 * 4,
                         repo=args.repo)
        bad += not ok
    print("failures:", bad)


if __name__ == "__main__":
    main()


def check_tolerance(shape, dtype, seed=0, repo=".", sched_seed=0):
    """The GPU test's bar with 16-bit inputs: P, dS, dk, dv rounded to ``dtype`` as the kernel rounds
    them, o from a float32 forward rounded to ``dtype``; err(ours) ≤ 2·err(torch in dtype) + 2·EPS
    (``conftest.assert_close_to_ref`` with the value-dim test's eps)."""
    sys.path.insert(0, repo)
    sys.path.insert(0, repo + "/tests")
    from flashattn_lite import reference as ref_mod
    from flashattn_lite.ops import attention_bwd_gluon as g
    from flashattn_lite.reference import rel_err
    eps = {torch.float16: 2e-3, torch.bfloat16: 1.5e-2}[dtype]
    B, Hq, Hkv, Nq, Nk = shape
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(B, Hq, Nq, 192, generator=gen).to(dtype), torch.randn(B, Hkv, Nk, 192, generator=gen).to(dtype)
    v, do = torch.randn(B, Hkv, Nk, 128, generator=gen).to(dtype), torch.randn(B, Hq, Nq, 128, generator=gen).to(dtype)
    scale = 192 ** -0.5
    o32, lse32 = ref_mod.attention_reference(q, k, v, causal=True, scale=scale, dtype=torch.float32)
    o = o32.to(dtype).double().numpy()
    lse = lse32.double().numpy()
    n = [t.double().numpy() for t in (q, k, v, do)]
    dq, dk, dv, _ = host_backward(*n, o, lse, scale, g, seed=sched_seed, lazy=False, round16=dtype)
    ours = [torch.from_numpy(x).to(dtype) for x in (dq, dk, dv)]
    leaves = [t.double().requires_grad_() for t in (q, k, v)]
    ref = torch.autograd.grad(ref_mod.attention_reference(*leaves, causal=True, scale=scale)[0], leaves,
                              do.double())
    leaves = [t.float().requires_grad_() for t in (q, k, v)]
    o_same, _ = ref_mod.attention_reference(*leaves, causal=True, scale=scale, dtype=torch.float32)
    same = [x.to(dtype) for x in torch.autograd.grad(o_same.to(dtype).float(), leaves, do.float())]
    out = []
    for name, a, s_, r in zip(("dq", "dk", "dv"), ours, same, ref):
        e_ours, e_same = rel_err(a, r), rel_err(s_, r)
        out.append((name, e_ours, e_same, e_ours <= 2 * e_same + 2 * eps))
    print(shape, dtype, " ".join(f"{n}: {a:.2e} vs 2*{b:.2e}+{2 * eps:.0e} {'ok' if ok else 'FAIL'}"
                                 for n, a, b, ok in out), flush=True)
    return all(ok for *_, ok in out)
