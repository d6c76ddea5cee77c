"""Ring attention: exact attention over a sequence sharded across the ranks of a process group.

Each of the W ranks holds n = N/W tokens of q, k, v (a layout of ``sharding``). K/V blocks travel
around the ring: at step s rank r holds the block of rank (r − s) mod W, and while it attends its
queries to that block the next block is already on its way (the exchange is posted before the
compute). Everything here is scheduling and communication; the math is the package's:

- forward: each (query slice, key slice) piece is one attention call (``_forward_impl``, with its
  lse), its causal diagonal and window placed by ``causal_offset`` (``schedule`` chooses the pieces)
  and the softcap, and the partial (o, lse) are merged in place into a float32 accumulator
  (``merge_pair_into``, the pair merge's in-place form; into o's dtype where a row has at most two
  terms, the same result: ``_sum_dtype``); sinks enter once, as one more term of each
  row's denominator: in the row's step-0 call where those tile the rows, else at the end;
- backward: FlashAttention-2's recomputation P = exp(S − lse) is exact for one key block when
  given the *global* o and lse (δ = rowsum(dO∘O) − dlse is a property of the query row, not of
  the block), so each piece is the attention backward (``_backward_impl``) with the global o and
  lse. dQ accumulates locally; each block's dK/dV accumulator starts at the next rank, follows
  the block one hop behind it, and its (W − 1)-th hop brings it back to the owner, which kept its
  own share.

What travels is planned once per call signature (``plan``): a K/V hop carries only the key rows
some later rank uses of the block, an accumulator hop only the rows touched so far, each as the
block's runs of such rows packed one after the other. Without a window that is the whole block.
With a window narrower than a shard it is the strips at the chunks' edges that the window reaches
across: about the window's width over contiguous shards (left + right rows), up to twice that over
zigzag ones (a block's two chunks).

Memory per rank is O(n): its own q, k, v, o, do, two K/V blocks in flight, its own block's dK/dV
sums and two accumulators in flight, never the whole sequence.
"""
from __future__ import annotations

import functools
import math
from typing import NamedTuple

import torch

from .. import _checks
from .._autograd import first_order_only
from .._runtime import runs_triton
from ..merge import add_sink_torch
from ..ops.attention import _backward_impl, _check_sinks, _check_softcap, _check_window, _forward_impl, _variant
from ..ops.attention_bwd import row_stats, sinks_grad
from ..ops.merge_states import merge_pair_into
from ._group import Group, agree, describe
from .sharding import check_layout, runs


# ------------------------------------------------------------------ which pieces to compute

class Piece(NamedTuple):
    """One attention call: local query rows [q0, q1) against local key rows [k0, k1). Counting
    query i' from q0 and key j' from k0, key j' is visible iff i' + offset − left ≤ j' and (with
    ``causal``) j' ≤ i' + offset, or (with ``right`` ≥ 0) j' ≤ i' + offset + right; a side of −1
    bounds nothing. This is ``attention_core``'s ``causal``, ``causal_offset`` and ``window``."""
    q0: int
    q1: int
    k0: int
    k1: int
    causal: bool
    offset: int
    left: int = -1
    right: int = -1


def _span(lo, hi):
    """The integer interval [lo, hi], or None when empty (sides may be ±inf)."""
    return (lo, hi) if lo <= hi else None


def _one_piece(q_runs, k_runs, left: float, right: float) -> list[Piece] | None:
    """The (query runs) × (key runs) rectangle as at most one call: [] when no key is visible to any
    query, [Piece] when one call gives exactly the global mask, None when no single call does.

    Globally key j is visible to query i iff −left ≤ j − i ≤ right (sides ±inf when unbounded;
    causal is right = 0). On a run pair j − i = j' − i' − d (d from the runs' global starts) and
    j' − i' spans [lo, hi], so the visible part is [d − left, d + right] ∩ [lo, hi]. A call masks
    [o − l, o + r] ∩ [lo, hi] with its offset o and its own sides (l, r each the global side, or
    unbounded where the global side cuts no pair). The plainest call that matches every pair wins
    (no mask, then one side, then both), at the first offset that matches among the interval ends
    (a set of valid offsets always has a member when it is not empty), then moved to the
    bottom-right offset with its sides changed to keep the mask where they stay ≥ 0 (the Hopper
    kernels take that one)."""
    qs, ks = q_runs[0][0], k_runs[0][0]
    pairs = []
    for q_local, q_global, q_len in q_runs:
        for k_local, k_global, k_len in k_runs:
            i0, j0 = q_local - qs, k_local - ks
            d = (q_global - i0) - (k_global - j0)
            lo, hi = j0 - (i0 + q_len - 1), j0 + k_len - 1 - i0
            pairs.append((d, lo, hi, _span(max(lo, d - left), min(hi, d + right))))
    if all(want is None for *_, want in pairs):
        return []
    q1, k1 = q_runs[-1][0] + q_runs[-1][2], k_runs[-1][0] + k_runs[-1][2]
    inf = float("inf")
    bottom_right = (k1 - ks) - (q1 - qs)
    for l, r in dict.fromkeys([(inf, inf), (inf, right), (left, inf), (left, right)]):
        ends = {bottom_right}
        for d, lo, hi, _ in pairs:
            ends |= {d, lo + l, hi - r, lo - r - 1, hi + l + 1}
        finite = [int(e) for e in ends if abs(e) != inf]
        ends = [bottom_right] + sorted(set(finite) | {min(finite) - 1, max(finite) + 1})
        for o in ends:
            if all(_span(max(lo, o - l), min(hi, o + r)) == want for _, lo, hi, want in pairs):
                # The mask is [o − l, o + r]: at the bottom-right offset the same bounds need sides
                # br − (o − l) and (o + r) − br; where both are ≥ 0 the Hopper kernels take the call.
                l_br, r_br = bottom_right - (o - l), (o + r) - bottom_right
                if l_br >= 0 and r_br >= 0:
                    o, l, r = bottom_right, l_br, r_br
                causal = r == 0
                return [Piece(qs, q1, ks, k1, causal, o, -1 if l == inf else int(l),
                              -1 if r == inf or causal else int(r))]
    return None


def _seen(run, others, left: float, right: float, keys: bool) -> tuple[float, float] | None:
    """The first and last global positions of ``run`` (a run as in ``_one_piece``) that see some
    position of the runs ``others`` (``keys``: ``run`` holds keys, seen by the others' rows), or
    None. Row i sees key j iff i − left ≤ j ≤ i + right."""
    _, g, n = run
    lo_side, hi_side = (left, right) if keys else (right, left)
    spans = [_span(max(g, og - lo_side), min(g + n - 1, og + on - 1 + hi_side)) for _, og, on in others]
    spans = [x for x in spans if x is not None]
    return (min(a for a, _ in spans), max(b for _, b in spans)) if spans else None


def _cut(run, first: float, last: float):
    """``run`` cut to global positions [first, last] (within it)."""
    local, g, n = run
    start, stop = int(first), int(last) + 1
    return (local + start - g, start, stop - start)


def _trimmed(runs, others, left: float, right: float, keys: bool) -> tuple:
    """``runs`` without the positions at their two ends that see nothing of ``others`` (or that
    nothing of them sees): the first run cut at its start, the last at its end, a run left empty
    dropped. Only the ends: a call spans its runs, so a cut between two runs would leave rows
    (or keys) of the call that no run pair accounts for."""
    runs = list(runs)
    while runs and _seen(runs[0], others, left, right, keys) is None:
        runs.pop(0)
    while runs and _seen(runs[-1], others, left, right, keys) is None:
        runs.pop()
    if runs:
        first, _ = _seen(runs[0], others, left, right, keys)
        runs[0] = _cut(runs[0], first, runs[0][1] + runs[0][2] - 1)
        _, last = _seen(runs[-1], others, left, right, keys)
        runs[-1] = _cut(runs[-1], runs[-1][1], last)
    return tuple(runs)


def _fewest_pieces(q_runs: tuple, k_runs: tuple, left: float, right: float) -> list[Piece]:
    """Exact cover of the visible pairs by the fewest calls: one call if possible, else the better
    of splitting the key runs or the query runs in two (layouts have at most two runs; one run
    pair is always one call, at its own offset). The rows at either end that see no key, and the
    keys at either end that no row sees, are left out first: a smaller call, and one whose mask
    may then sit at the bottom-right offset (a windowed ring's strip of its neighbour's block)."""
    q_runs = _trimmed(q_runs, k_runs, left, right, keys=False)
    k_runs = _trimmed(k_runs, q_runs, left, right, keys=True)
    if not q_runs or not k_runs:
        return []
    one = _one_piece(q_runs, k_runs, left, right)
    if one is not None:
        return one
    cover = lambda qr, kr: _fewest_pieces(qr, kr, left, right)  # noqa: E731
    options = []
    if len(k_runs) > 1:
        h = len(k_runs) // 2
        options.append(cover(q_runs, k_runs[:h]) + cover(q_runs, k_runs[h:]))
    if len(q_runs) > 1:
        h = len(q_runs) // 2
        options.append(cover(q_runs[:h], k_runs) + cover(q_runs[h:], k_runs))
    return min(options, key=len)


def schedule(layout: str, rank: int, world: int, n_local: int, causal: bool,
             window: tuple[int, int] = (-1, -1)) -> tuple[list[Piece], ...]:
    """The pieces rank ``rank`` computes at each ring step s, against the block of rank (rank − s) mod W.

    ``window``: (left, right) over global positions, −1 unbounded (``attention``'s sides; causal
    caps right at 0). Without a mask every step is one full call. With one, a block entirely
    hidden is skipped (no pieces) and one entirely visible runs unmasked; with zigzag shards and
    causal alone every step is a single call (the diagonal block causal; the others n × n/2,
    unmasked). A window can split a block into up to four calls."""
    left, right = (float("inf") if side < 0 else side for side in window)
    if causal:
        right = min(right, 0)
    if left == float("inf") and right == float("inf"):
        return tuple([Piece(0, n_local, 0, n_local, False, 0)] for _ in range(world))
    mine = tuple(runs(layout, rank, world, n_local))
    return tuple(_fewest_pieces(mine, tuple(runs(layout, (rank - s) % world, world, n_local)), left, right)
                 for s in range(world))


class Hops(NamedTuple):
    """What each ring step sends, the same table on every rank (``plan``). ``kv[s]``: the K/V hop
    posted at step s (for step s + 1); ``grads[s]``: the dK/dV accumulator hop posted at step s. Each
    is (rows, spans): ``spans[b]`` the runs of rank b's block it carries, sorted disjoint [lo, hi)
    row ranges laid one after the other in the buffer (empty: none of them), ``rows`` the buffer's
    row count, the most any block needs (0: no hop at that step)."""
    kv: tuple
    grads: tuple


def _union(ranges) -> tuple:
    """The sorted, disjoint [lo, hi) runs covering ``ranges`` (ranges that overlap or touch are
    joined), as a tuple: the rows a hop carries of one block, in buffer order."""
    out = []
    for lo, hi in sorted(r for r in ranges if r[1] > r[0]):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return tuple(out)


def _width(runs) -> int:
    return sum(hi - lo for lo, hi in runs)


def _rows_of(runs, lo: int, hi: int) -> slice:
    """Where key rows [lo, hi) sit in a buffer laid out as ``runs`` (they lie within one run)."""
    if hi <= lo:
        return slice(0, 0)
    start = 0
    for a, e in runs:
        if a <= lo and hi <= e:
            return slice(start + lo - a, start + hi - a)
        start += e - a
    raise AssertionError(f"rows [{lo}, {hi}) are not within one run of {runs}")  # plan's invariant


def _hop(spans) -> tuple:
    return max(map(_width, spans), default=0), tuple(spans)


def plan(layout: str, world: int, n_local: int, causal: bool, window: tuple[int, int] = (-1, -1)) -> tuple:
    """(every rank's ``schedule``, the ``Hops``) of a ring of ``world`` ranks holding ``n_local``
    tokens each (``layout``; zigzag: an even count), ``causal`` and ``window`` (left, right; −1
    unbounded) as ``ring_attention`` takes them. Raises ValueError / TypeError naming a bad argument."""
    check_layout(layout)
    for name, value, least in (("world", world, 1), ("n_local", n_local, 1)):
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise ValueError(f"{name} must be an int >= {least}, got {value!r}")
    if layout == "zigzag" and n_local % 2:
        raise ValueError(f"n_local must be even for layout='zigzag', got {n_local}")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    if (not isinstance(window, tuple) or len(window) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) and x >= -1 for x in window)):
        raise ValueError(f"window must be a (left, right) tuple of ints >= -1 (-1: unbounded), got {window!r}")
    return _plan(layout, world, n_local, causal, window)


@functools.lru_cache(maxsize=64)
def _plan(layout: str, world: int, n_local: int, causal: bool, window: tuple[int, int]) -> tuple:
    """``plan``'s tables, once per call signature. Rank b's block is at rank b + t at step t, which
    uses the key rows ``used[b][t]`` (that step's pieces' ranges, joined into runs by ``_union``).
    So a K/V hop carries only the rows some later rank uses, and the dK/dV accumulator of block b,
    started at rank b + 1 (the owner keeps its own block's gradient), only the rows ranks b + 1 …
    b + s touched; its last hop (step W − 1) lands at the owner. Without a window every hop is the
    whole block; with one narrower than a shard, its left + right rows (zigzag: up to twice)."""
    steps = tuple(schedule(layout, r, world, n_local, causal, window) for r in range(world))
    used = [[[(p.k0, p.k1) for p in steps[(b + t) % world][t]] for t in range(world)] for b in range(world)]
    kv = tuple(_hop([_union(r for t in range(s + 1, world) for r in used[b][t]) for b in range(world)])
               for s in range(world - 1))
    grads = tuple(_hop([_union(r for t in range(1, s + 1) for r in used[b][t]) for b in range(world)])
                  for s in range(world))
    return steps, Hops(kv, grads)


# ------------------------------------------------------------------ forward and backward

def _row_numel(k_shape, v_shape) -> int:
    """Elements of one key row of k and v together (a packed buffer's row)."""
    return k_shape[0] * k_shape[1] * k_shape[3] + v_shape[0] * v_shape[1] * v_shape[3]


def _unpack(buf: torch.Tensor, k_shape, v_shape):
    """Views of ``buf``'s k part (shape ``k_shape``, first) and v part (``v_shape``)."""
    nk, nv = math.prod(k_shape), math.prod(v_shape)
    return buf[:nk].view(k_shape), buf[nk:nk + nv].view(v_shape)


def _rows_view(buf: torch.Tensor, k_shape, v_shape):
    """``_unpack`` of a packed buffer of k and v rows shaped like ``k_shape`` / ``v_shape`` but for
    their row count, which is the buffer's."""
    rows = buf.numel() // _row_numel(k_shape, v_shape)
    return _unpack(buf, (*k_shape[:2], rows, k_shape[3]), (*v_shape[:2], rows, v_shape[3]))


def _piece_variant(q_p, k_p, p: Piece, softcap: float, sinks):
    """The kernels' ``Variant`` of a piece's call: its window (with its causal and offset), the
    call's softcap, and ``sinks`` where the piece takes them."""
    window = None if p.left < 0 and p.right < 0 else (p.left, p.right)
    return _variant(q_p, k_p, window=window, softcap=softcap or None, sinks=sinks, alibi_slopes=None, offset=p.offset)


class _Held(NamedTuple):
    """The K/V block a rank holds at a step: k, v (its rows ``runs``, one after the other) and, when
    they are views of a received hop, that packed buffer (None for the rank's own k, v)."""
    k: torch.Tensor | None
    v: torch.Tensor | None
    runs: tuple = ()
    buf: torch.Tensor | None = None


def _post_kv(ring, hops: Hops, step: int, held: _Held):
    """Post step ``step``'s K/V hop (None where there is none): the runs of the held block that
    later ranks use, packed in a buffer of the hop's row count (the received buffer itself, padding
    and all, where its runs and row count are the hop's: no copy of a whole block at each step)."""
    if step >= len(hops.kv) or hops.kv[step][0] == 0:
        return None
    rows, spans = hops.kv[step]
    runs = spans[(ring.rank - step) % ring.world]
    if held.buf is not None and runs == held.runs and rows == held.k.shape[2]:
        return ring.shift(held.buf)
    k_shape, v_shape = held.k.shape, held.v.shape
    buf = torch.empty(_row_numel(k_shape, v_shape) * rows, dtype=held.k.dtype, device=held.k.device)
    k_out, v_out = _rows_view(buf, k_shape, v_shape)
    start = 0
    for lo, hi in runs:
        rows_held = _rows_of(held.runs, lo, hi)
        k_out[:, :, start:start + hi - lo].copy_(held.k[:, :, rows_held])
        v_out[:, :, start:start + hi - lo].copy_(held.v[:, :, rows_held])
        start += hi - lo
    if start < rows:  # a hop padded to the block that needs the most rows: no unset memory goes over the wire
        k_out[:, :, start:].zero_()
        v_out[:, :, start:].zero_()
    return ring.shift(buf)


def _take_kv(incoming, ring, hops: Hops, step: int, k_shape, v_shape) -> _Held:
    """The block held at step ``step`` + 1, or one of Nones where no hop came (then no later step
    has pieces)."""
    if incoming is None:
        return _Held(None, None)
    buf = incoming.wait()
    runs = hops.kv[step][1][(ring.rank - step - 1) % ring.world]
    return _Held(*_rows_view(buf, k_shape, v_shape), runs, buf)


def _tiles(spans, n: int) -> bool:
    """Whether the [lo, hi) ``spans`` cover [0, n) once each: then step 0's pieces write the ring's
    sums (no zero fill, no read of zeros) and the later steps add to them."""
    ends = 0
    for lo, hi in sorted(spans):
        if lo != ends:
            return False
        ends = hi
    return ends == n


def _one_more_term(spans) -> bool:
    """Whether the [lo, hi) ``spans`` (the later steps' pieces' rows) overlap nowhere: then, after
    step 0's pieces wrote them, each row of a sum takes at most one more term."""
    ends = 0
    for lo, hi in sorted(spans):
        if lo < ends:
            return False
        ends = max(ends, hi)
    return True


def _sum_dtype(steps, n: int, dtype: torch.dtype, wide: torch.dtype, *, rows: bool) -> torch.dtype:
    """The dtype a rank sums its pieces' rows (``rows``; else keys) of length ``n`` in: the inputs'
    16-bit ``dtype`` where step 0's pieces tile them and (rows) no later piece overlaps another,
    else ``wide`` (float32, or float64 for the float64 twin's backward). A float32 sum of two 16-bit
    terms rounded once to 16 bits is what the 16-bit tensor's in-place add gives (torch adds in
    float32 and rounds once), so the results are the same, without the float32 passes: step 0's
    writes move 4 bytes an element, not 6, and no cast at the end. With more terms each 16-bit add
    would round again. Keys take one more term at most by construction: the accumulator hop's
    float32 sum. A ``dtype`` as wide as ``wide`` or wider keeps ``wide`` (float64 inputs merge in
    float32, as before)."""
    if dtype.itemsize >= wide.itemsize:
        return wide
    side = (lambda p: (p.q0, p.q1)) if rows else (lambda p: (p.k0, p.k1))
    if not _tiles([side(p) for p in steps[0]], n):
        return wide
    if rows and not _one_more_term([side(p) for pieces in steps[1:] for p in pieces]):
        return wide
    return dtype


def _write_or_add(into: torch.Tensor, value: torch.Tensor, write: bool) -> None:
    if write:
        into.copy_(value)
    else:
        into += value


def _forward(q, k, v, sinks, *, scale: float, softcap: float, ring, steps, hops: Hops):
    """(o, lse) of this rank's queries over the whole sequence (and the sinks). ``ring`` has
    ``shift(tensor)``, ``rank`` and ``world`` (see ``_group.Group``); ``steps`` and ``hops`` are
    ``plan(...)``'s for this rank. The pieces call the kernels' entry (``_forward_impl``), as the
    backward does: ``ring_attention`` checked the arguments, and the ring is not traced."""
    B, Hq, n, _ = q.shape
    # float32 partials where a row has more than two terms: W merges in bf16 would round W times
    # (merges take float32 lse, so float64 inputs merge in float32 too).
    written = _tiles([(p.q0, p.q1) for p in steps[0]], n)
    dtype = _sum_dtype(steps, n, q.dtype, torch.float32, rows=True)
    out = (torch.empty if written else torch.zeros)((B, Hq, n, v.shape[3]), dtype=dtype, device=q.device)
    lse = torch.empty((B, Hq, n), dtype=torch.float32, device=q.device)
    if not written:
        lse.fill_(float("-inf"))
    held = _Held(k, v, ((0, k.shape[2]),))
    for step, pieces in enumerate(steps):
        incoming = _post_kv(ring, hops, step, held)
        for p in pieces:
            keys = _rows_of(held.runs, p.k0, p.k1)
            # Where step 0's pieces tile the rows, each row's sink joins its one step-0 call (the
            # merges carry it on): no pass over the output at the end.
            q_p, k_p, v_p = q[:, :, p.q0:p.q1], held.k[:, :, keys], held.v[:, :, keys]
            first = step == 0 and written
            variant = _piece_variant(q_p, k_p, p, softcap, sinks if first else None)
            # Step 0's pieces write their rows of the sums (where those are in q's dtype the kernel
            # writes them there: ``_forward_impl``'s ``out``), the later ones are merged in.
            o_p, lse_p = _forward_impl(q_p, k_p, v_p, None, scale, p.causal, p.offset, 0.0, 0, True, variant,
                                       out=out[:, :, p.q0:p.q1] if first and dtype == q.dtype else None)
            if first:
                if dtype != q.dtype:
                    out[:, :, p.q0:p.q1].copy_(o_p)
                lse[:, :, p.q0:p.q1].copy_(lse_p)
            else:
                merge_pair_into(out[:, :, p.q0:p.q1], lse[:, :, p.q0:p.q1], o_p, lse_p.float())
        held = _take_kv(incoming, ring, hops, step, k.shape, v.shape)
    if sinks is not None and not written:  # one more term of each row's denominator, with no value
        out, lse = add_sink_torch(out, lse, sinks.view(1, Hq, 1))
    return out.to(q.dtype), lse


def _add_rows(acc, acc_runs, k_shape, v_shape, received, received_runs):
    """Add the accumulator ``received`` (packed dK/dV of rows ``received_runs``) into ``acc`` (rows
    ``acc_runs``: the rows touched only grow, so each received run lies within one of them)."""
    dk_acc, dv_acc = _rows_view(acc, k_shape, v_shape)
    dk_in, dv_in = _rows_view(received, k_shape, v_shape)
    start = 0
    for lo, hi in received_runs:
        rows = _rows_of(acc_runs, lo, hi)
        dk_acc[:, :, rows] += dk_in[:, :, start:start + hi - lo]
        dv_acc[:, :, rows] += dv_in[:, :, start:start + hi - lo]
        start += hi - lo


def _backward(do, dlse, q, k, v, o, lse, sinks, *, scale: float, softcap: float, ring, steps, hops: Hops):
    """(dq, dk, dv, dsinks) for this rank's shards. This rank keeps its own block's dK/dV (step 0);
    the block it holds at step s ≥ 1 (rank r − s's) gets the pieces' gradient added to the
    accumulator received from rank r − 1 (the ranks before it that touched the block), passed on to
    rank r + 1; the last hop brings each rank the others' share of its own block. Each accumulator
    carries only the rows touched so far (``Hops.grads``). The pieces run without the sinks: the
    global lse already holds them, and P = exp(S − lse) is all a piece's backward needs. dsinks is
    this rank's rows' share (``sinks_grad``), as for any parameter its queries use."""
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32  # sums of per-block gradients
    rows_written = _tiles([(p.q0, p.q1) for p in steps[0]], q.shape[2])
    keys_written = _tiles([(p.k0, p.k1) for p in steps[0]], k.shape[2])
    dq_dtype = _sum_dtype(steps, q.shape[2], q.dtype, acc, rows=True)
    dq = (torch.empty if rows_written else torch.zeros)(q.shape, dtype=dq_dtype, device=q.device)
    per_row = _row_numel(k.shape, v.shape)
    # This rank's block's dK/dV.
    own_dtype = _sum_dtype(steps, k.shape[2], k.dtype, acc, rows=False)
    own = (torch.empty if keys_written else torch.zeros)(per_row * k.shape[2], dtype=own_dtype, device=k.device)
    whole = ((0, k.shape[2]),)
    held = _Held(k, v, whole)
    acc_in = None  # the accumulator hop from rank r − 1 posted at the step before (its runs: Hops.grads)
    for step, pieces in enumerate(steps):
        incoming = _post_kv(ring, hops, step, held)
        block = (ring.rank - step) % ring.world
        if step == 0:
            mine, runs = own, whole
        else:
            rows, spans = hops.grads[step]
            mine, runs = torch.zeros(per_row * rows, dtype=acc, device=k.device), spans[block]
        dk_acc, dv_acc = _rows_view(mine, k.shape, v.shape)
        for p in pieces:
            rows_q, keys, sums = slice(p.q0, p.q1), _rows_of(held.runs, p.k0, p.k1), _rows_of(runs, p.k0, p.k1)
            # The Triton backward reads lse as a dense (B, H, N) array, hence the copy of a slice.
            # (dq, dk, dv) lead the result (options such as sinks may append their gradients).
            q_p, k_p = q[:, :, rows_q], held.k[:, :, keys]
            # Step 0's pieces write the sums' rows; where all three are in the inputs' dtypes they
            # go there directly (``_backward_impl``'s ``out``: the Gluon kernels write into the
            # views, other paths copy in).
            into = None
            if step == 0 and rows_written and keys_written and dq.dtype == q.dtype and own.dtype == k.dtype:
                into = (dq[:, :, rows_q], dk_acc[:, :, sums], dv_acc[:, :, sums])
            dq_p, dk_p, dv_p = _backward_impl(
                do[:, :, rows_q], q_p, k_p, held.v[:, :, keys], o[:, :, rows_q],
                lse[:, :, rows_q].contiguous(), None if dlse is None else dlse[:, :, rows_q].contiguous(),
                None, scale, p.causal, p.offset, 0.0, 0, _piece_variant(q_p, k_p, p, softcap, None), out=into)[:3]
            if into is None:
                _write_or_add(dq[:, :, rows_q], dq_p, step == 0 and rows_written)
                _write_or_add(dk_acc[:, :, sums], dk_p, step == 0 and keys_written)
                _write_or_add(dv_acc[:, :, sums], dv_p, step == 0 and keys_written)
        if step > 0:
            if acc_in is not None:  # this block's sums from the ranks before, posted at step − 1
                _add_rows(mine, runs, k.shape, v.shape, acc_in.wait(), hops.grads[step - 1][1][block])
            acc_in = ring.shift(mine, tag=1) if hops.grads[step][0] > 0 else None
        held = _take_kv(incoming, ring, hops, step, k.shape, v.shape)
    if acc_in is not None:  # the last hop: the other ranks' share of this rank's own block
        _add_rows(own, whole, k.shape, v.shape, acc_in.wait(), hops.grads[len(steps) - 1][1][ring.rank])
    dk, dv = _unpack(own, k.shape, v.shape)
    dsinks = None
    if sinks is not None:
        if runs_triton(o) and o.dtype != torch.float64:
            delta = row_stats(do, o, lse, dlse)[0]  # one read of dO and O, as the kernels' own backward
        else:  # the float64 twin, and CPU tensors without the interpreter
            delta = (do.to(acc) * o.to(acc)).sum(-1) - (0.0 if dlse is None else dlse.to(acc))
        dsinks = sinks_grad(sinks, lse, delta)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dsinks


class _RingAttentionFn(torch.autograd.Function):
    """Forward and backward of the whole ring as one autograd node (the backward needs the global
    o and lse, and must run the same communication on every rank)."""

    @staticmethod
    def forward(ctx, q, k, v, sinks, scale, softcap, ring, steps, hops):
        o, lse = _forward(q, k, v, sinks, scale=scale, softcap=softcap, ring=ring, steps=steps, hops=hops)
        ctx.save_for_backward(q, k, v, o, lse, sinks)
        ctx.args = dict(scale=scale, softcap=softcap, ring=ring, steps=steps, hops=hops)
        ctx.set_materialize_grads(False)
        return o, lse

    @staticmethod
    def backward(ctx, do, dlse):
        q, k, v, o, lse, sinks = ctx.saved_tensors
        if do is None:
            do = torch.zeros_like(o)
        wants_dsinks = sinks is not None and ctx.needs_input_grad[3]
        dq, dk, dv, dsinks = _backward(do, dlse, q, k, v, o, lse, sinks if wants_dsinks else None, **ctx.args)
        dq, dk, dv, dsinks = first_order_only((dq, dk, dv, dsinks), (q, k, v, sinks), "ring_attention")
        return dq, dk, dv, dsinks, None, None, None, None, None


# ------------------------------------------------------------------ validation and public API

class _Options(NamedTuple):
    """A call's checked score options."""
    scale: float | None   # None: D ** -0.5
    window: tuple[int, int]
    softcap: float        # 0: none
    sinks: torch.Tensor | None


def _check_local(q, k, v, causal, scale, window, softcap, sinks, layout, return_lse, group: Group) -> _Options:
    """Everything one rank can check alone."""
    dtypes = _checks.FLOAT_DTYPES
    if isinstance(q, torch.Tensor) and not runs_triton(q):
        dtypes += (torch.float64,)  # the CPU twin, for exact checks
    for name, t in (("q", q), ("k", k), ("v", v)):
        _checks.check_tensor(name, t, ndim=4, dtypes=dtypes)
    _checks.check_same(("q", "k", "v"), (q, k, v), "dtype")
    _checks.check_same(("q", "k", "v"), (q, k, v), "device")
    group.check_device("q", q)
    B, Hq, n, D = q.shape
    if min(q.shape) == 0 or min(k.shape) == 0 or min(v.shape) == 0:
        raise ValueError(f"q, k, v must be non-empty, got shapes {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    for name, t in (("k", k), ("v", v)):
        _checks.check_dim(name, "batch size (dim 0)", t.shape[0], B, "q's")
        _checks.check_dim(name, "local sequence length (dim 2)", t.shape[2], n, "q's")
    _checks.check_dim("v", "heads (dim 1)", v.shape[1], k.shape[1], "k's")
    _checks.check_dim("k", "head dim (dim 3)", k.shape[3], D, "q's")
    if Hq % k.shape[1] != 0:
        raise ValueError(f"q heads ({Hq}) must be a multiple of k/v heads ({k.shape[1]}) for GQA/MQA")
    _checks.check_head_dim("q/k", D)
    _checks.check_head_dim("v", v.shape[3])
    check_layout(layout)
    if layout == "zigzag" and n % 2 != 0:
        raise ValueError(f"q, k, v local sequence length (dim 2) must be even for layout='zigzag' (each rank "
                         f"holds two half-shards), got {n}")
    _checks.check_bool("causal", causal)
    _checks.check_bool("return_lse", return_lse)
    return _Options(_checks.check_scale(scale), _check_window(window), _check_softcap(softcap),
                    _check_sinks(sinks, q, Hq))


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                   scale: float | None = None, window: tuple | None = None, softcap: float | None = None,
                   sinks: torch.Tensor | None = None, group=None, layout: str = "zigzag", return_lse: bool = False):
    """Exact attention over a sequence sharded across the ranks of ``group`` (ring / context parallel).

    Args:
        q: (B, Hq, n, D), k: (B, Hkv, n, D), v: (B, Hkv, n, Dv): this rank's shard of a global
            sequence of W·n tokens (W = the size of ``group``; ``shard`` cuts a full tensor), laid
            out by ``layout``. Same shapes and dtype on every rank. GQA, Dv ≠ D, dtypes and
            strides as in ``flashattn_lite.attention``; float64 on the CPU twin (merges are float32).
            CUDA tensors for the NCCL backend (``torch.cuda.set_device`` to each rank's GPU), CPU
            tensors for gloo.
        causal: key at global position j visible to the query at global position i iff j ≤ i.
        scale: multiplies q·k; defaults to D ** -0.5.
        window: (left, right) over global positions, as in ``attention``: key j visible to query i
            iff i − left ≤ j ≤ i + right (None or −1: unbounded; causal caps right at 0). Blocks
            outside every query's window are skipped.
        softcap: scores capped as c·tanh(s / c) (Gemma 2), as in ``attention``.
        sinks: (Hq,) one logit per head in every row's denominator (gpt-oss), as in ``attention``;
            the same values on every rank. Its gradient is this rank's rows' share: sum it over
            the group as for any parameter the sharded sequence uses.
        group: a ``torch.distributed`` process group (default: the whole world).
        layout: ``"zigzag"`` (n even; balances causal work across ranks) or ``"contiguous"``.
        return_lse: also return the log-sum-exp over the whole sequence, (B, Hq, n) float32.

    Returns:
        o (B, Hq, n, Dv) in q's dtype: this rank's shard of the output (and lse), same layout.

    Every rank of ``group`` must call it, and run the backward, with the same arguments: bad
    arguments (on any rank, or differing between ranks) raise on every rank, after one small
    all-gather and before any K/V moves. Communication: W − 1 K/V transfers to the next rank in
    the forward, posted before each block's compute so they overlap it; in the backward the same
    and W − 1 transfers of the dK/dV accumulators (float32; float64 for float64 inputs). Each
    carries only the rows the ranks after it use or have touched (``plan``): with a window narrower
    than a shard, about its width (left + right rows; up to twice over zigzag's two chunks a block).
    Memory per rank O(n·(D + Dv)). Speed on sm_90: each call takes the Hopper kernels where its
    mask's diagonal is the bottom-right one or unused: every call without a window, and a window's
    calls, each cut to the rows and keys it needs, wherever its mask can sit there.
    """
    g = Group(group)
    error, checked = None, None
    try:
        checked = _check_local(q, k, v, causal, scale, window, softcap, sinks, layout, return_lse, g)
    except Exception as e:  # noqa: BLE001 - any error (a meta scale's .item(), …) raises on every rank
        error = e
    # Whether a backward will follow must agree too: a rank without one would leave the others waiting.
    needs_grad = torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad
                                                 for t in (q, k, v, sinks))
    same = lambda name: repr(getattr(checked, name, None))  # noqa: E731 (None on a rank whose checks failed)
    agree(g, "ring_attention", error, {"q": describe(q), "k": describe(k), "v": describe(v), "causal": repr(causal),
                                       "scale": same("scale"), "window": same("window"),
                                       "softcap": same("softcap"), "sinks": describe(sinks),
                                       "layout": repr(layout), "requires_grad": repr(needs_grad)},
          values={"sinks": getattr(checked, "sinks", None)})  # a replicated parameter: its values too
    scale = q.shape[-1] ** -0.5 if checked.scale is None else checked.scale
    every, hops = plan(layout, g.world, q.shape[2], causal, checked.window)
    o, lse = _RingAttentionFn.apply(q, k, v, checked.sinks, scale, checked.softcap, g, every[g.rank], hops)
    return (o, lse) if return_lse else o
