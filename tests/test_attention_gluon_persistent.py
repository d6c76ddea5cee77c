"""The persistent schedule of the Gluon forward (``Config.persistent``, ops/attention_fwd_gluon.py) on
any machine: its tile order (``persistent_count``, ``persistent_unit``, ``sorted_tail_slot``,
``persistent_tile``, run by the interpreter or the GPU in a tiny Triton kernel), a model of its
barrier bookkeeping, its launch and configs. The kernel itself runs in the GPU tests
(tests/test_attention_gluon.py: every config against float64, and few programs walking many tiles).

The model runs the loader and the consumers of one program as Python generators under a random
scheduler, with the kernel's slot, set and parity formulas and mbarriers that complete a phase per
``count`` arrivals and answer a wait by parity as ``mbarrier.try_wait.parity`` does. It fails on a
deadlock (nobody can move), on a wait that returns for another phase than the one its code means
(a barrier two phases ahead), on a load into a buffer a consumer still reads and on a consumer
reading another tile's data; and shows it would catch the likely mistakes (a ring slot counted per
tile, a single Q set loaded after more than STAGES of the tile's K/V tiles).
"""
import random

import pytest
import torch
import triton
import triton.language as tl

from conftest import DEVICE, ON_GPU, model_only
from flashattn_lite.ops import attention_fwd
from flashattn_lite.ops import attention_fwd_gluon as gluon_fwd
from flashattn_lite.ops.attention_fwd import PLAIN, SEQ_RANGES, SEQ_VARLEN, Variant


# ---------------------------------------------------------------- the tile order (any machine)

@triton.jit
def _deal_kernel(out, n_bh, n_heads, n_q, n_k, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 MAX_TILES: tl.constexpr, SORTED_TAIL: tl.constexpr):
    # Program pid's tiles in the order its loader and consumers walk them: (unit, bh, b, h, start_m,
    # key tiles) each, after a count (the unit as ``persistent_unit`` deals them: without a sorted tail).
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    row = out + pid * (1 + 6 * MAX_TILES)
    n_m = tl.cdiv(n_q, BLOCK_M)
    count = gluon_fwd.persistent_count(pid, programs, n_bh, n_m, CAUSAL, SORTED_TAIL)
    for j in range(count):
        u, i = gluon_fwd.persistent_unit(j, pid, programs, n_bh, n_m, CAUSAL)
        bh, b, h, start_m, lo, n_tiles, mid_lo, mid_hi = gluon_fwd.persistent_tile(
            j, n_bh, n_heads, n_q, n_k, None, None, CAUSAL, False, False, BLOCK_M, BLOCK_N, SORTED_TAIL)
        tl.store(row + 1 + 6 * j, u)
        tl.store(row + 2 + 6 * j, bh)
        tl.store(row + 3 + 6 * j, b)
        tl.store(row + 4 + 6 * j, h)
        tl.store(row + 5 + 6 * j, start_m)
        tl.store(row + 6 + 6 * j, n_tiles)
    tl.store(row, count)


def persistent_deal(B, H, n_q, n_k, causal, block_m, block_n, programs, sorted_tail=False):
    """Each program's tiles, [(unit, bh, b, h, start_m, key tiles), …], as the kernel deals them."""
    tiles = B * H * triton.cdiv(n_q, block_m)
    most = triton.cdiv(tiles, programs) + 2
    out = torch.full((programs, 1 + 6 * most), -1, dtype=torch.int32, device=DEVICE)
    _deal_kernel[(programs,)](out, B * H, H, n_q, n_k, causal, block_m, block_n, most, sorted_tail)
    rows = out.tolist()
    return [[tuple(row[1 + 6 * k:7 + 6 * k]) for k in range(row[0])] for row in rows]


def key_tile_count(start_m, n_q, n_k, causal, block_m, block_n):
    """A one-tile program's key tiles (the zero-padded tail; under causal the bottom-right diagonal:
    none for rows above it when Nq > Nk)."""
    hi = min(max(start_m + block_m + n_k - n_q, 0), n_k) if causal else n_k
    return triton.cdiv(hi, block_n)


def pairs_reference(n_bh, n_m, programs):
    """Each program's (bh, heavy) list of a causal launch without a sorted tail, written with lists
    (heavy 0: a head's last query tile): head-major units dealt round-robin, a unit pairing a head's
    k-th heaviest tile with its k-th lightest (heavy first), the middle tile of an odd count last,
    alone."""
    units = ([[(bh, k), (bh, n_m - 1 - k)] for bh in range(n_bh) for k in range(n_m // 2)]
             + [[(bh, n_m // 2)] for bh in range(n_bh) if n_m % 2])
    return [[tile for unit in units[pid::programs] for tile in unit] for pid in range(programs)]


def reference_loads(B, H, n, block_m, block_n, programs, sorted_tail):
    """Each program's key tiles under the Python deal (``pairs_reference``, ``sorted_tail_reference``)
    of a causal launch with Nq = Nk = n."""
    n_m = triton.cdiv(n, block_m)
    deal = (sorted_tail_reference if sorted_tail else pairs_reference)(B * H, n_m, programs)
    return [sum(key_tile_count((n_m - 1 - heavy) * block_m, n, n, True, block_m, block_n) for _, heavy in tiles)
            for tiles in deal]


def deal_loads(B, H, n, block_m, block_n, programs, sorted_tail=False):
    """Each program's key tiles at a model's shape, by the Python deal; on the GPU the kernel's deal
    (``persistent_deal``) too, which must match it (the interpreter runs 132 programs over thousands
    of tiles in minutes, so the CPU suite checks the kernel against the same lists at small shapes)."""
    loads = reference_loads(B, H, n, block_m, block_n, programs, sorted_tail)
    if ON_GPU:
        deal = persistent_deal(B, H, n, n, True, block_m, block_n, programs, sorted_tail)
        assert [sum(t[5] for t in tiles) for tiles in deal] == loads
    return loads


@pytest.mark.parametrize("B, H, n_q, n_k, causal, block_m, block_n, programs", [
    (2, 3, 1000, 1037, True, 192, 64, 5), (1, 4, 1300, 1000, True, 128, 128, 3), (3, 2, 300, 300, False, 192, 128, 4),
    (1, 1, 1, 17, True, 192, 128, 1), (2, 2, 700, 700, True, 128, 64, 7)],
    ids=["causal-odd", "nq>nk-even", "full", "one-row", "causal-few-tiles"])
def test_every_tile_dealt_once_in_head_major_units(B, H, n_q, n_k, causal, block_m, block_n, programs):
    # Every (head, query tile) exactly once over the programs, with its one-tile program's key
    # tiles; program pid takes units pid, pid + programs, …; units head-major; under causal a unit
    # pairs a head's j-th heaviest tile with its j-th lightest (heavy first), and the middle tiles
    # of an odd count come last, alone.
    n_m = triton.cdiv(n_q, block_m)
    deal = persistent_deal(B, H, n_q, n_k, causal, block_m, block_n, programs)
    seen = sorted((bh, start_m) for tiles in deal for _, bh, _, _, start_m, _ in tiles)
    assert seen == sorted((bh, m * block_m) for bh in range(B * H) for m in range(n_m))
    units = {}
    for pid, tiles in enumerate(deal):
        for u, bh, b, h, start_m, n_tiles in tiles:
            assert u % programs == pid and (b, h) == (bh // H, bh % H)
            assert n_tiles == key_tile_count(start_m, n_q, n_k, causal, block_m, block_n)
            units.setdefault(u, []).append((bh, start_m))
    assert sorted(units) == list(range(len(units)))
    last = lambda k: (n_m - 1 - k) * block_m  # the k-th heaviest tile's first row
    want = ([[(bh, last(k)), (bh, last(n_m - 1 - k))] for bh in range(B * H) for k in range(n_m // 2)]
            + [[(bh, last(n_m // 2))] for bh in range(B * H) if n_m % 2]) if causal else \
        [[(bh, last(k))] for bh in range(B * H) for k in range(n_m)]
    assert [units[u] for u in sorted(units)] == want
    if causal:  # the Python deal the balance tests use
        got = [[(bh, n_m - 1 - start_m // block_m) for _, bh, _, _, start_m, _ in tiles] for tiles in deal]
        assert got == pairs_reference(B * H, n_m, programs)
    if causal and n_q > n_k:
        assert 0 in [t[5] for tiles in deal for t in tiles]  # tiles with no key tile: the model takes those too


@pytest.mark.parametrize("d, n, block_m, block_n, bound", [(128, 8192, 128, 128, 1.035), (128, 2048, 192, 64, 1.035),
                                                         (64, 16384, 192, 128, 1.06)])
def test_causal_units_balance(d, n, block_m, block_n, bound):
    # B·N 16k, hidden 2048, on 132 SMs, a tile's cost its key tiles: the most loaded program within
    # `bound` of the mean (the rest is granularity: 1024 units on 132 programs at d 128 8k), and
    # under what the head-major tiles dealt one by one round-robin would give (8% over at d 128 8k).
    B, H, programs = 16384 // n, 2048 // d, 132
    loads = deal_loads(B, H, n, block_m, block_n, programs)
    mean = sum(loads) / programs
    assert max(loads) <= bound * mean
    n_m = triton.cdiv(n, block_m)
    costs = [key_tile_count((n_m - 1 - t % n_m) * block_m, n, n, True, block_m, block_n) for t in range(B * H * n_m)]
    assert max(sum(costs[pid::programs]) for pid in range(programs)) > max(loads)


@triton.jit
def _varlen_queue_kernel(out, cu, n_seq, total, n_heads, group, step, BLOCK_M: tl.constexpr, SCAN: tl.constexpr):
    # The loader's side of the varlen work queue: units 0, step, 2·step, … (a program's units only
    # increase), each unit t's (h, b, start_m) as ``_loader_queue`` maps it (``scan_from``, its
    # place kept from unit to unit, and ``queue_tile``), after the unit count.
    lanes = tl.arange(0, SCAN)
    units = gluon_fwd.varlen_tile_count(cu, cu + 1, n_seq, total, lanes, BLOCK_M) * n_heads
    c = 0
    seen = 0
    for t in range(0, units, step):
        b, u, n_b, c, seen = gluon_fwd.scan_from(cu, cu + 1, n_seq, total, t, lanes, BLOCK_M, 1, c, seen, n_heads)
        h, start_m = gluon_fwd.queue_tile(u, n_b, group, BLOCK_M)
        tl.store(out + 1 + 3 * t, h)
        tl.store(out + 2 + 3 * t, b)
        tl.store(out + 3 + 3 * t, start_m)
    tl.store(out, units)


def varlen_queue(lens, H, block_m, scan=32, total=None, step=1, group=1):
    """The queue's units [(h, b, start_m), …] in order, as the loader maps them (every ``step``-th
    one taken, the others None)."""
    cu = torch.tensor([0] + lens).cumsum(0).to(torch.int32).to(DEVICE)
    total = int(cu[-1]) if total is None else total
    out = torch.full((1 + 3 * (sum(triton.cdiv(n, block_m) for n in lens) + len(lens)) * H,), -1, dtype=torch.int32,
                     device=DEVICE)
    _varlen_queue_kernel[(1,)](out, cu, len(lens), total, H, group, step, block_m, scan)
    flat = out.tolist()
    return [tuple(flat[1 + 3 * t:4 + 3 * t]) if t % step == 0 else None for t in range(flat[0])]


def queue_reference(lens, H, block_m, group=1):
    """Sequence by sequence: one KV head's tiles after another, each sequence's last tile first, a
    tile's ``group`` query heads together."""
    return [(h_kv * group + r, b, (triton.cdiv(n, block_m) - 1 - i) * block_m) for b, n in enumerate(lens)
            for h_kv in range(H // group) for i in range(triton.cdiv(n, block_m)) for r in range(group)]


@pytest.mark.parametrize("lens, H, block_m, scan, group", [
    ([300, 800, 948], 4, 128, 32, 1), ([1], 1, 128, 32, 1), ([0, 129, 0, 0, 17], 3, 192, 32, 3),
    ([5] * 40 + [700], 2, 128, 16, 1), ([1000, 17, 4097 - 1017], 4, 128, 4, 2)],
    ids=["three", "one-row", "empty-sequences", "more-sequences-than-a-chunk", "four-lanes-gqa"])
def test_varlen_queue_holds_every_tile_once(lens, H, block_m, scan, group):
    # The queue's units are every (head, sequence, query tile) once, sequence by sequence, one KV
    # head after another, without the one-tile grid's empty slots (empty sequences have none);
    # chunked scans give the same as one.
    want = queue_reference(lens, H, block_m, group)
    assert sorted(want) == sorted((h, b, i * block_m) for b, n in enumerate(lens) for h in range(H)
                                  for i in range(triton.cdiv(n, block_m)))
    assert varlen_queue(lens, H, block_m, scan, group=group) == want
    assert varlen_queue(lens, H, block_m, 64, group=group) == want
    # a program's units jump ahead (others took the ones between): the scan's place moves on
    for step in (5, 131):
        assert varlen_queue(lens, H, block_m, scan, step=step, group=group) == [
            u if i % step == 0 else None for i, u in enumerate(want)]


@triton.jit
def _ranges_queue_kernel(out, ranges, n_rows, n_q, n_heads, BLOCK_M: tl.constexpr):
    # The loader's mapping over per-row ranges ((B, 2) int32: bounds two apart), as for varlen.
    lanes = tl.arange(0, 32)
    units = gluon_fwd.varlen_tile_count(ranges, ranges + 1, n_rows, n_q, lanes, BLOCK_M, 2) * n_heads
    c = 0
    seen = 0
    for t in range(units):
        b, u, n_b, c, seen = gluon_fwd.scan_from(ranges, ranges + 1, n_rows, n_q, t, lanes, BLOCK_M, 2, c, seen,
                                                 n_heads)
        h, start_m = gluon_fwd.queue_tile(u, n_b, 1, BLOCK_M)
        tl.store(out + 1 + 3 * t, h)
        tl.store(out + 2 + 3 * t, b)
        tl.store(out + 3 + 3 * t, start_m)
    tl.store(out, units)


def test_ranges_queue_holds_every_rows_tiles_once():
    # Per-row ranges (the bounds read two apart, clamped into the row's n_q): each row's tiles from
    # its range's start, none past its end, none of an empty range; 40 rows span two scan chunks.
    rows = [(0, 700), (5, 5), (699, 700), (3, 300), (650, 900), (-4, 10)] * 6 + [(0, 64)] * 4
    n_q, H, bm = 700, 3, 128
    ranges = torch.tensor(rows, dtype=torch.int32, device=DEVICE)
    out = torch.full((1 + 3 * len(rows) * triton.cdiv(n_q, bm) * H,), -1, dtype=torch.int32, device=DEVICE)
    _ranges_queue_kernel[(1,)](out, ranges, len(rows), n_q, H, bm)
    flat = out.tolist()
    lens = [min(max(b, 0), n_q) - min(max(a, 0), n_q) if b > a else 0 for a, b in rows]
    assert [tuple(flat[1 + 3 * t:4 + 3 * t]) for t in range(flat[0])] == queue_reference(lens, H, bm)


def test_varlen_queue_reads_bounds_clamped_into_the_rows():
    # Unchecked bounds past the packed rows (check_seqlens=False) are read clamped, as the one-tile
    # scan reads them: the tiles of the rows that exist, no more.
    assert varlen_queue([300, 500], 2, 128, total=600) == queue_reference([300, 300], 2, 128)


def test_a_queue_balances_the_mixed_batch_where_a_static_deal_cannot():
    # Why varlen takes its tiles from a queue: the benchmark's 22 mixed sequences (32k tokens, 16
    # heads, 128-row tiles, causal: a tile's cost its key tiles) on 132 programs. Taken in the
    # queue's order by whichever program is free first, the most loaded program is 5% over the
    # mean; dealt in that order round-robin, 17% over (a sequence's falling costs do not line up
    # with the rounds). (Every head of a tile together, the model's greedy queue ends 0.7% over,
    # yet measured no faster on this batch: its programs read every head's K/V at once, NOTES
    # 2026-12-02 18:25.)
    import heapq
    from flashattn_lite.bench.variants import mixed_lengths
    units, programs = queue_reference(mixed_lengths(32768), 16, 128), 132
    cost = [start_m // 128 + 1 for _, _, start_m in units]
    mean = sum(cost) / programs
    free = [(0, pid) for pid in range(programs)]
    for c in cost:
        load, pid = heapq.heappop(free)
        heapq.heappush(free, (load + c, pid))
    assert max(load for load, _ in free) <= 1.06 * mean
    assert max(sum(cost[pid::programs]) for pid in range(programs)) >= 1.15 * mean


def sorted_tail_reference(n_bh, n_m, programs):
    """Each program's (bh, heavy) list of a causal launch with a sorted tail, by the rule
    ``sorted_tail_slot`` states, written with sorts and lists (heavy 0: a head's last query tile)."""
    deal = [[] for _ in range(programs)]
    pairs = n_m // 2
    units = [(bh, k) for bh in range(n_bh) for k in range(pairs)]
    head_units = max(len(units) // programs - 1, 0) * programs
    for u, (bh, k) in enumerate(units[:head_units]):
        deal[u % programs] += [(bh, k), (bh, n_m - 1 - k)]
    tail = units[head_units:]
    ordered = ([(bh, k) for bh, k in sorted(tail, key=lambda t: (t[1], t[0]))]
               + [(bh, pairs) for bh in range(n_bh) if n_m % 2]
               + [(bh, n_m - 1 - k) for bh, k in sorted(tail, key=lambda t: (-t[1], t[0]))])
    for g, tile in enumerate(ordered):
        r, place = divmod(g, programs)
        deal[place if r % 2 == 0 else programs - 1 - place].append(tile)
    return deal


def test_sorted_tail_reference_by_hand():
    # The reference itself on a shape whose tail starts inside a head: 14 heads · 4 pairs = 56
    # units on 5 programs, 50 head units (10 a program: units pid, pid + 5, …), then head 12's
    # pairs 2, 3 and head 13's four, sorted by cost (heavy halves by k, light halves by k down)
    # and dealt in a snake.
    deal = sorted_tail_reference(14, 8, 5)
    assert deal[1][:4] == [(0, 1), (0, 6), (1, 2), (1, 5)]  # units 1 and 6
    assert [tiles[20:] for tiles in deal] == [[(13, 0), (13, 5), (13, 6)], [(13, 1), (12, 5), (13, 7)],
                                             [(12, 2), (13, 4)], [(13, 2), (12, 4)], [(12, 3), (13, 3)]]


@pytest.mark.parametrize("B, H, n_q, n_k, block_m, block_n, programs", [
    (2, 3, 1000, 1037, 192, 64, 5), (1, 4, 1300, 1000, 128, 128, 3), (1, 1, 1, 17, 192, 128, 1),
    (2, 2, 700, 700, 128, 64, 7), (5, 7, 2100, 2100, 128, 128, 6), (4, 5, 1100, 1100, 128, 128, 4)],
    ids=["odd", "nq>nk-even", "one-row", "few-tiles", "partial-tail-head", "odd-many-heads"])
def test_sorted_tail_deals_every_tile_once_in_the_stated_order(B, H, n_q, n_k, block_m, block_n, programs):
    # The causal deal with a sorted tail: every (head, query tile) once, with its one-tile
    # program's key tiles, in the order the sorted-list reference gives.
    n_m = triton.cdiv(n_q, block_m)
    deal = persistent_deal(B, H, n_q, n_k, True, block_m, block_n, programs, sorted_tail=True)
    for tiles in deal:
        for _, bh, b, h, start_m, n_tiles in tiles:
            assert (b, h) == (bh // H, bh % H)
            assert n_tiles == key_tile_count(start_m, n_q, n_k, True, block_m, block_n)
    got = [[(bh, n_m - 1 - start_m // block_m) for _, bh, _, _, start_m, _ in tiles] for tiles in deal]
    assert got == sorted_tail_reference(B * H, n_m, programs)
    assert sorted(t for tiles in got for t in tiles) == [(bh, m) for bh in range(B * H) for m in range(n_m)]


@pytest.mark.parametrize("n, block_m, block_n", [(2048, 128, 128), (4096, 128, 128), (2048, 192, 64)])
def test_sorted_tail_balance(n, block_m, block_n):
    # B·N 16k, hidden 2048 at d 64 (256 heads at 2k), 132 SMs, a tile's cost its key tiles: the most
    # loaded program within 1.5% (2.5% with 192-row tiles) of the mean, under the pairs' deal
    # (3.1% over at these shapes); the tail spans few heads.
    B, H, programs = 16384 // n, 32, 132
    n_m = triton.cdiv(n, block_m)
    loads = {}
    for sorted_tail in (False, True):
        loads[sorted_tail] = deal_loads(B, H, n, block_m, block_n, programs, sorted_tail)
    mean = sum(loads[True]) / programs
    assert max(loads[True]) <= (1.015 if block_m == block_n else 1.025) * mean < max(loads[False])
    head_units = max(B * H * (n_m // 2) // programs - 1, 0) * programs
    reference = sorted_tail_reference(B * H, n_m, programs)
    tail_heads = {bh for tiles in reference for bh, _ in tiles[2 * head_units // programs:]}
    assert len(tail_heads) <= triton.cdiv(2 * programs, n_m // 2) + 1 + (B * H if n_m % 2 else 0)


# ---------------------------------------------------------------- a model of the barriers

class Barrier:
    """An mbarrier: a phase completes after ``count`` arrivals (a TMA fill: the expect's arrival and
    the bytes, one event here)."""

    def __init__(self, name, count):
        self.name, self.count, self.pending, self.completed = name, count, count, 0

    def arrive(self):
        self.pending -= 1
        if self.pending == 0:
            self.completed += 1
            self.pending = self.count

    def passes(self, parity):  # mbarrier.try_wait.parity: the phase of that parity has completed
        return self.completed % 2 != parity


class NamedBarrier:
    """A ping-pong turn (``_wait_turn``, ``_pass_turn``): a hardware named barrier of 256 threads
    between the consumer that waits on it (``bar.sync``) and the one before, which arrives without
    waiting (``bar.arrive``). A wait returns once an arrival is there for it (``completed``:
    arrivals so far; ``take`` marks the wait returned). A second arrival before the waiter took the
    first would complete a generation without the waiter: the model fails on it."""

    def __init__(self, name):
        self.name, self.completed, self.taken = name, 0, 0

    def arrive(self):
        assert self.completed == self.taken, f"{self.name}: an arrival before the waiter took the one before"
        self.completed += 1

    def passes(self, parity):
        return self.completed > self.taken

    def take(self):
        self.taken += 1


class Buffer:
    """A K or V ring slot or a Q set: which tile it holds, whether its fill landed, how many
    consumers released it."""

    def __init__(self, consumers):
        self.consumers, self.holds, self.landed, self.released = consumers, None, True, consumers

    def fill(self, what):
        assert self.released == self.consumers, f"load of {what} over {self.holds}, still read"
        self.holds, self.landed, self.released = what, False, 0

    def read(self, what):
        assert self.landed and self.holds == what, f"read {what}, the buffer holds {self.holds}"

    def release(self, what):
        self.read(what)
        self.released += 1


def wait(bar, parity, phase):
    """What a partition yields to wait: ``phase`` is the phase (0, 1, …; −1: the fresh barrier's
    "previous" one) its code means, checked when the wait returns."""
    return bar, parity, phase


def run_program(tiles, stages, consumers, q_sets, pingpong, seed, per_tile_ring=False, q_after=None, v_stages=None,
                first_turn_twice=False):
    """One program's partitions over its tiles (``tiles``: each tile's n_tiles), scheduled at random;
    raises AssertionError on a deadlock or a hazard. ``v_stages``: V's ring depth where it differs
    from K's (``stages``). ``per_tile_ring`` (consumers count ring slots per tile) and ``q_after``
    (the loader's Q after that many of a tile's K/V loads, one Q set) and ``first_turn_twice`` (the
    first turn given at the kernel's start as well as by the last consumer) are the mistakes the model
    must catch."""
    rng = random.Random(seed)
    v_stages = v_stages or stages
    k_ready = [Barrier(f"k_ready{s}", 1) for s in range(stages)]
    v_ready = [Barrier(f"v_ready{s}", 1) for s in range(v_stages)]
    k_empty = [Barrier(f"k_empty{s}", consumers) for s in range(stages)]
    v_empty = [Barrier(f"v_empty{s}", consumers) for s in range(v_stages)]
    q_ready = [Barrier(f"q_ready{i}", 1) for i in range(q_sets)]
    q_empty = [Barrier(f"q_empty{i}", consumers) for i in range(q_sets)]
    turn = [NamedBarrier(f"turn{c}") for c in range(consumers)]
    k_buf = [Buffer(consumers) for _ in range(stages)]
    v_buf = [Buffer(consumers) for _ in range(v_stages)]
    q_buf = [Buffer(consumers) for _ in range(q_sets)]
    landing = []  # TMA fills issued, not landed: (buffer, barrier)
    issued = []  # the consumers' GEMM issues in order: (consumer, k)
    if first_turn_twice:
        turn[0].arrive()

    def tma(buf, bar, what):
        buf.fill(what)
        landing.append((buf, bar))

    def load_kv(k, tile):
        s, use = k % stages, k // stages
        yield wait(k_empty[s], (use & 1) ^ 1, use - 1)
        tma(k_buf[s], k_ready[s], ("K", k, tile))
        s, use = k % v_stages, k // v_stages
        yield wait(v_empty[s], (use & 1) ^ 1, use - 1)
        tma(v_buf[s], v_ready[s], ("V", k, tile))

    def load_q(i):
        qs, use = i % q_sets, i // q_sets
        yield wait(q_empty[qs], (use & 1) ^ 1, use - 1)
        tma(q_buf[qs], q_ready[qs], ("Q", i))

    def loader():  # _loader_persistent
        kv = 0
        for i, n in enumerate(tiles):
            first = 0
            if q_sets == 1:
                first = min(n, min(stages, v_stages) if q_after is None else q_after)
                for j in range(first):
                    yield from load_kv(kv + j, i)
            yield from load_q(i)
            for j in range(first, n):
                yield from load_kv(kv + j, i)
            kv += n

    def consumer(me):  # _consumer_persistent and _attend
        other = (me + 1) % consumers
        kv = 0
        if pingpong and me == consumers - 1:
            turn[0].arrive()  # consumer 0 issues first
        held = None  # two Q sets: the set of the tile before, released in this tile once S_0 retired

        def release_held():
            q_buf[held[0]].release(("Q", held[1]))  # after the O store has read the set
            q_empty[held[0]].arrive()

        for i, n in enumerate(tiles):
            qs = i % q_sets
            yield wait(q_ready[qs], (i // q_sets) & 1, i // q_sets)
            q_buf[qs].read(("Q", i))
            base = 0 if per_tile_ring else kv
            for j in range(n):
                c = base + j
                cur = c % stages
                yield wait(k_ready[cur], (c // stages) & 1, c // stages)
                k_buf[cur].read(("K", kv + j, i))
                if j > 0:
                    prev = (c - 1) % v_stages
                    yield wait(v_ready[prev], ((c - 1) // v_stages) & 1, (c - 1) // v_stages)
                    v_buf[prev].read(("V", kv + j - 1, i))
                if pingpong:
                    yield wait(turn[me], None, c)
                    turn[me].take()
                    issued.append((me, kv + j))
                    turn[other].arrive()
                k_buf[cur].release(("K", kv + j, i))
                k_empty[cur].arrive()
                if j == 0 and held is not None:
                    release_held()
                    held = None
                if j > 0:
                    v_buf[prev].release(("V", kv + j - 1, i))
                    v_empty[prev].arrive()
            if n > 0:
                last = base + n - 1
                yield wait(v_ready[last % v_stages], (last // v_stages) & 1, last // v_stages)
                v_buf[last % v_stages].release(("V", kv + n - 1, i))
                v_empty[last % v_stages].arrive()
            if q_sets == 1:
                q_buf[qs].release(("Q", i))  # after the O store has read the set
                q_empty[qs].arrive()
            else:
                if held is not None:  # a tile without key tiles releases the one before at its end
                    release_held()
                held = (qs, i)
            kv += n

    agents = {"loader": loader(), **{f"consumer{c}": consumer(c) for c in range(consumers)}}
    waiting = {name: None for name in agents}
    done = set()

    def step(name):
        try:
            waiting[name] = next(agents[name])
        except StopIteration:
            done.add(name)

    for name in agents:
        step(name)
    while len(done) < len(agents) or landing:
        movers = [n for n in agents if n not in done and waiting[n][0].passes(waiting[n][1])]
        choices = movers + (["tma"] if landing else [])
        assert choices, "deadlock: " + ", ".join(f"{n} waits on {w[0].name} phase {w[2]} (parity {w[1]}, "
                                                 f"{w[0].completed} completed)" for n, w in waiting.items()
                                                 if n not in done)
        pick = rng.choice(choices)
        if pick == "tma":
            buf, bar = landing.pop(rng.randrange(len(landing)))
            buf.landed = True
            bar.arrive()
            continue
        bar, parity, phase = waiting[pick]
        assert bar.completed == phase + 1, (f"{pick}: wait on {bar.name} for phase {phase} returned with "
                                            f"{bar.completed} phases completed")
        step(pick)
    if pingpong:  # the GEMMs in turn: consumer 0, 1, … for every K/V tile of the program
        assert issued == [(c, k) for k in range(sum(tiles)) for c in range(consumers)]
    return sum(tiles)


SCHEDULES = [(stages, consumers, q_sets, pingpong) for stages in (2, 3, 4) for consumers in (1, 2, 3)
             for q_sets in (1, 2) for pingpong in ((False, True) if consumers > 1 else (False,))]


def random_tiles(rng, stages):
    """A program's tiles: their key-tile counts, 0 (a causal tile above the diagonal) to a few rings."""
    return [rng.choice([0, 1, stages - 1, stages, stages + 1, rng.randrange(2 * stages + 3)])
            for _ in range(rng.randrange(1, 7))]


@model_only
@pytest.mark.parametrize("stages, consumers, q_sets, pingpong", SCHEDULES,
                         ids=[f"s{s}-c{c}-q{q}{'-pp' if p else ''}" for s, c, q, p in SCHEDULES])
def test_barriers_never_deadlock_or_overrun(stages, consumers, q_sets, pingpong):
    rng = random.Random(stages * 100 + consumers * 10 + q_sets + 7 * pingpong)
    for seed in range(40):
        run_program(random_tiles(rng, stages), stages, consumers, q_sets, pingpong, seed)
    # Many tiles with no key tile in a row, and a long program: the parities wrap many times.
    run_program([0, 0, 0, 1, 0, 0, 2], stages, consumers, q_sets, pingpong, 1)
    run_program([stages + 1] * 30, stages, consumers, q_sets, pingpong, 2)


RING_DEPTHS = [(2, 3), (3, 2), (2, 4)]  # (K's stages, V's), as ``Config.v_stages`` sets them


@model_only
@pytest.mark.parametrize("q_sets", [1, 2])
@pytest.mark.parametrize("stages, v_stages", RING_DEPTHS, ids=[f"k{k}-v{v}" for k, v in RING_DEPTHS])
def test_barriers_with_rings_of_their_own_depth(stages, v_stages, q_sets):
    # K's and V's rings of different depths: slots and parities counted per ring; with one Q set the
    # loader takes min(depths) K/V tiles of the tile before its Q.
    rng = random.Random(stages * 10 + v_stages + q_sets)
    for seed in range(40):
        run_program(random_tiles(rng, max(stages, v_stages)), stages, 2, q_sets, True, seed, v_stages=v_stages)
    run_program([max(stages, v_stages) + 1] * 30, stages, 2, q_sets, True, 2, v_stages=v_stages)


@model_only
def test_the_model_catches_a_ring_counted_per_tile():
    # The ring's slot from the tile's j alone: the second tile's K/V land in other slots than the
    # consumers read (or a wait never passes).
    with pytest.raises(AssertionError):
        for seed in range(20):
            run_program([2, 3, 1], 3, 2, 2, True, seed, per_tile_ring=True)


@model_only
@pytest.mark.parametrize("q_sets", [1, 2])
def test_the_model_catches_a_late_single_q_set(q_sets):
    # One Q set loaded after STAGES + 1 of the tile's K/V tiles: that load waits for the tile's
    # first slot, which its consumers free only once they have the tile's Q: a deadlock. At
    # STAGES it runs; two sets never take that path.
    stages, tiles = 2, [5, 5, 5]
    run_program(tiles, stages, 2, q_sets, True, 0, q_after=stages)
    if q_sets == 1:
        with pytest.raises(AssertionError, match="deadlock"):
            run_program(tiles, stages, 2, q_sets, True, 0, q_after=stages + 1)


@model_only
def test_the_model_catches_a_turn_given_twice():
    # Two arrivals on consumer 0's named barrier before it waits: a generation of 256 arrivals without
    # the waiter, and the turns one behind from then on.
    run_program([3, 2], 2, 2, 1, True, 0)
    with pytest.raises(AssertionError, match="arrival before the waiter"):
        run_program([3, 2], 2, 2, 1, True, 0, first_turn_twice=True)


# ---------------------------------------------------------------- the launch and the configs (no GPU)

PERSISTENT = [(d, c) for d in gluon_fwd.HEAD_DIMS for c in gluon_fwd.CONFIGS[d] if c.persistent]


def test_configs():
    # Persistent configs in the sweep for each head dim, named -ps; Q double-buffered where two sets
    # and the rings fit (all but m128 n128 with two 3-deep rings at d 128, and d 256); every config fits
    # in shared memory.
    assert {d for d, _ in PERSISTENT} == set(gluon_fwd.HEAD_DIMS)
    for d, configs in gluon_fwd.CONFIGS.items():
        for cfg in configs:
            assert cfg.name.endswith("-ps") == cfg.persistent
            assert cfg.smem_bytes(d, cfg.q_sets(d)) <= gluon_fwd.SMEM_BYTES
            one_set = (not cfg.persistent or d == 256
                       or ((d, cfg.block_m, cfg.block_n) == (128, 128, 128) and not cfg.v_stages))
            assert cfg.q_sets(d) == (1 if one_set else 2)
            assert cfg._replace(persistent=False).name + "-ps" == cfg._replace(persistent=True).name
            flat = gluon_fwd.one_tile_per_program(cfg)  # how ranges and varlen run it
            assert not flat.persistent and not flat.v_stages and flat.stages == max(cfg.stages, cfg.v_stages)
    # The default: persistent below 8k (d 128 causal without ALiBi: below 12k), with any options but for d 64's
    # non-causal calls with ALiBi, or softcap and a window's left side (two consumers one tile per
    # program: the three spill); d 256 at every length, but causal from 12k.
    for d in gluon_fwd.HEAD_DIMS:
        for causal in (False, True):
            for n in (1024, 2048, 8191, 8192, 12287, 12288, 16384):
                for flags in ((False, False, False), (False, True, False), (False, False, True),
                              (True, False, False), (False, True, True), (True, True, True)):
                    alibi, softcap, left = flags
                    limit = gluon_fwd.CAUSAL_PERSISTENT_MAX_N if d == 128 and causal and not alibi else 8192
                    spills = d == 64 and not causal and (alibi or (softcap and left))
                    if d == 256:
                        limit = gluon_fwd.CAUSAL_PERSISTENT_MAX_N if causal else 1 << 31
                    persistent = n < limit and not spills
                    assert gluon_fwd.default_config(d, causal, n, *flags).persistent == persistent


@pytest.mark.skipif(not gluon_fwd._HAS_GLUON, reason="no Gluon in this triton (TMA descriptors on CPU tensors)")
@pytest.mark.parametrize("d, cfg", PERSISTENT, ids=[f"d{d}-{c.name}" for d, c in PERSISTENT])
def test_persistent_launch(d, cfg):
    # min(tiles, SMs) programs in one dim (132 off the GPU, or as asked), PERSISTENT, Q_SETS and
    # V_STAGES passed, the arguments of the one-tile launch; that launch passes none of them (the
    # kernel it compiled to before: benchmarks/ptx_hashes.py) and keeps its grid.
    B, H, N = 2, 4, 1000
    q, kv = torch.zeros(B, H, N, d, dtype=torch.bfloat16), torch.zeros(B, H // 2, N, d, dtype=torch.bfloat16)
    o, lse = torch.empty_like(q), torch.empty(B, H, N)
    tiles = B * H * triton.cdiv(N, cfg.block_m)
    one_tile = gluon_fwd.one_tile_per_program(cfg)
    grid1, args1, kwargs1 = gluon_fwd._launch(q, kv, kv, o, lse, 0.125, True, one_tile)
    assert grid1 == (tiles,) and not {"PERSISTENT", "Q_SETS", "V_STAGES"} & set(kwargs1)  # head-major, one dim
    for sms, programs in ((None, min(tiles, gluon_fwd.DEFAULT_SMS)), (5, 5), (10_000, tiles)):
        grid, args, kwargs = gluon_fwd._launch(q, kv, kv, o, lse, 0.125, True, cfg, sms=sms)
        assert grid == (programs,)
        assert kwargs == {**kwargs1, "STAGES": cfg.stages, "PERSISTENT": True, "Q_SETS": cfg.q_sets(d),
                          "V_STAGES": cfg.v_stages or cfg.stages}
        assert [type(a) for a in args] == [type(a) for a in args1] and args[4:] == args1[4:]
    variant = Variant(softcap=30.0, sinks=torch.zeros(H), left=100)
    grid, args, kwargs = gluon_fwd._launch(q, kv, kv, o, lse, 0.125, True, cfg, variant, sms=7)
    assert grid == (7,) and kwargs["PERSISTENT"] and kwargs["SOFTCAP"] and kwargs["SINKS"] and kwargs["HAS_LEFT"]


@pytest.mark.skipif(not gluon_fwd._HAS_GLUON, reason="no Gluon in this triton (TMA descriptors on CPU tensors)")
def test_persistent_takes_ranges_and_varlen():
    # Per-row ranges and packed varlen batches take a persistent config through the work queue:
    # min(the one-tile grid's programs, SMs) programs, the one-tile launch's arguments but the
    # queue's counter (a zeroed int32; None one tile a program), SEQ.
    d, cfg = PERSISTENT[0]
    ranges = torch.tensor([[0, 5], [2, 7]], dtype=torch.int32)
    q, k = torch.zeros(2, 4, 7, d, dtype=torch.float16), torch.zeros(2, 2, 9, d, dtype=torch.float16)
    cu = torch.tensor([0, 3, 7], dtype=torch.int32)
    varlen = Variant(seq=SEQ_VARLEN, seq_q=cu, seq_k=cu)
    q1, k1 = torch.zeros(1, 4, 7, d, dtype=torch.float16), torch.zeros(1, 2, 7, d, dtype=torch.float16)
    for variant, qq, kk, slots in ((Variant(seq=SEQ_RANGES, seq_q=ranges, seq_k=ranges), q, k, 2 * 4),
                                   (varlen, q1, k1, (1 + 2) * 4)):
        o, lse = attention_fwd.output_buffers(qq, d, variant, True)
        grid1, args1, kwargs1 = gluon_fwd._launch(qq, kk, kk, o, lse, 0.125, True,
                                                  gluon_fwd.one_tile_per_program(cfg), variant)
        assert "PERSISTENT" not in kwargs1 and kwargs1["SEQ"] == variant.seq and grid1 == (slots,)
        assert args1[-1] is None  # no work queue
        for sms, programs in ((None, slots), (5, 5)):
            grid, args, kwargs = gluon_fwd._launch(qq, kk, kk, o, lse, 0.125, True, cfg, variant, sms=sms)
            same = [a.data_ptr() == b.data_ptr() if isinstance(a, torch.Tensor) else a == b
                    for a, b in zip(args[4:-1], args1[4:-1])]
            assert grid == (programs,) and all(same)
            assert args[-1].dtype == torch.int32 and args[-1].tolist() == [0]  # the queue's counter, from 0
            assert kwargs == {**kwargs1, "STAGES": cfg.stages, "PERSISTENT": True, "Q_SETS": cfg.q_sets(d),
                              "V_STAGES": cfg.v_stages or cfg.stages}
    # A V ring of its own depth is a persistent config's: refused one tile per program.
    with pytest.raises(ValueError, match="v_stages"):
        gluon_fwd._launch(q1, k1, k1, o, lse, 0.125, True, gluon_fwd.Config(2, 128, 2, True, v_stages=3), varlen)
    # The same tensors as a dense batch: taken (8 tiles, 8 programs).
    grid, _, _ = gluon_fwd._launch(q, k, k, torch.empty_like(q), torch.empty(2, 4, 7), 0.125, False, cfg, PLAIN)
    assert grid == (2 * 4,)



def record_configs(monkeypatch) -> list:
    """The configs ``attention_forward_gluon`` launches with, from here on (each launch then raises)."""
    taken = []

    def launch(q, k, v, o, lse, scale, causal, cfg, variant=PLAIN):
        taken.append(cfg)
        raise RuntimeError("recorded")
    monkeypatch.setattr(gluon_fwd, "_launch", launch)
    return taken


def forward(q, variant, config=None):
    """A causal self-attention call of q through the Gluon forward, up to its (recorded) launch."""
    with pytest.raises(RuntimeError, match="recorded"):
        gluon_fwd.attention_forward_gluon(q, q, q, 0.1, True, variant=variant, config=config)

@pytest.mark.skipif(not gluon_fwd._HAS_GLUON, reason="no Gluon in this triton (TMA descriptors on CPU tensors)")
def test_ranges_and_varlen_take_the_queue_by_default(monkeypatch):
    # Whatever the sequence count (the loader keeps its place in the bounds: 2048 sequences of 16
    # ran 5.3 × the one-tile kernel), a persistent default config stays persistent for varlen and
    # ranges batches.
    taken = record_configs(monkeypatch)
    for n_seq, rows in ((1, 10000), (3000, 10)):
        cu = torch.arange(0, rows * n_seq + 1, rows, dtype=torch.int32)
        q = torch.zeros(1, 2, rows * n_seq, 128, dtype=torch.bfloat16)
        forward(q, Variant(seq=SEQ_VARLEN, seq_q=cu, seq_k=cu))
    rows = torch.tensor([[0, 100]] * 300, dtype=torch.int32)
    q = torch.zeros(300, 2, 100, 128, dtype=torch.bfloat16)
    forward(q, Variant(seq=SEQ_RANGES, seq_q=rows, seq_k=rows))
    assert len(taken) == 3 and all(cfg.persistent for cfg in taken)


@pytest.mark.skipif(not gluon_fwd._HAS_GLUON, reason="no Gluon in this triton (TMA descriptors on CPU tensors)")
def test_long_padded_rows_take_the_queue(monkeypatch):
    # Per-row ranges of any length take the queue by default (one KV head's tiles after another:
    # ``queue_tile``; 4 × 8k MHA 32, 128 MiB of K and V a row, 4% faster than one tile a program).
    taken = record_configs(monkeypatch)
    for n in (2048, 8192):  # 16 KV heads, d 128, bf16: 16 MiB and 64 MiB of K and V a row
        rows = torch.tensor([[0, n], [5, n]], dtype=torch.int32)
        forward(torch.zeros(2, 16, n, 128, dtype=torch.bfloat16), Variant(seq=SEQ_RANGES, seq_q=rows, seq_k=rows))
    assert gluon_fwd.default_config(128, True, 8192).persistent  # (d 128 causal: persistent below 12k)
    assert len(taken) == 2 and all(cfg.persistent for cfg in taken)


@pytest.mark.skipif(not gluon_fwd._HAS_GLUON, reason="no Gluon in this triton (TMA descriptors on CPU tensors)")
def test_small_calls_run_one_tile_a_program(monkeypatch):
    # Where the one-tile grid has no more programs than SMs (132 off the GPU) no program would take
    # a second tile: the default runs one tile a program there (the queue would only add its
    # counter's fill: a left-padded generation step's single query row); one more program, the queue.
    taken = record_configs(monkeypatch)
    rows = torch.tensor([[3, 1], [0, 1]], dtype=torch.int32)  # (empty and one-row ranges)
    for heads in (66, 67):  # 2 rows × 1 tile × heads programs: 132, 133
        q = torch.zeros(2, heads, 1, 128, dtype=torch.bfloat16)
        k = torch.zeros(2, heads, 400, 128, dtype=torch.bfloat16)  # (13 MiB of K and V a row)
        with pytest.raises(RuntimeError, match="recorded"):
            gluon_fwd.attention_forward_gluon(q, k, k, 0.1, True, variant=Variant(seq=SEQ_RANGES, seq_q=rows,
                                                                                   seq_k=rows))
    cu = torch.tensor([0, 100, 300], dtype=torch.int32)  # (cdiv(300, 128) + 2) × heads programs
    for heads in (26, 27):  # 130, 135
        forward(torch.zeros(1, heads, 300, 128, dtype=torch.bfloat16), Variant(seq=SEQ_VARLEN, seq_q=cu, seq_k=cu))
    assert [cfg.persistent for cfg in taken] == [False, True, False, True]
