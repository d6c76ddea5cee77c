"""Do 2-CTA clusters work in Gluon (triton 3.6, sm_90) with inline PTX? ``PYTHONPATH=. python
benchmarks/experiments/cluster_probe.py [--out DIR] [--timeout S]`` on an H100/H200 runs three self-checking probes,
each in its own subprocess under a timeout; ``--compile-only`` (no GPU) builds each for sm_90 through ptxas.
D: B's push in a kernel compiled for one CTA, clustered by the launch alone (no CGA layouts).
A: CTA 0 alone TMA-loads a 64x64 bf16 box multicast to both CTAs, which each store what they got. B: CTA 1 pushes a
64x64 fp32 tile into CTA 0's shared memory by st.async, completing on CTA 0's mbarrier; CTA 0 adds its own tile and
stores the sum. C: B inside gl.warp_specialize (a worker pushes on CTA 1, the default partition receives on CTA 0).
Gluon 3.6 has no cluster API: num_ctas=2 makes the cluster, every layout has cga_layout [[0,0]] (built on the host),
and raw shared addresses are global_smem plus allocation offsets read from the TTGIR (NOTES 2026-11-30)."""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

TARGET = GPUTarget("cuda", 90, 32)
# Host-built layouts (kernels read them as constexpr globals): with num_ctas=2 each needs one CGA basis,
# [[0, 0]] = each CTA holds the whole tile.
RL = gl.constexpr(gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0], cga_layout=[[0, 0]]))  # 64x64, 4 warps, no dups
BL = gl.constexpr(mbarrier.MBarrierLayout(cga_layout=[[0]]))
NVMMA = gl.NVMMASharedLayout(128, 16, cga_layout=[[0, 0]])  # 128B swizzle, bf16: the host descriptor's layout
FLAT = gl.constexpr(gl.SwizzledSharedLayout(1, 1, 1, [1, 0], cga_layout=[[0, 0]]))  # row-major: (i,j) at 4*(64i+j)
ROW0, COL0 = 64, 128  # the box probe A loads from its 128x192 source (distinct, to catch swapped coordinates)
# Cluster barrier for every thread of both CTAs (after mbarrier inits, before exit); the non-.aligned forms, as
# partitions reach it at different pcs.
CSYNC = gl.constexpr("{ fence.mbarrier_init.release.cluster; barrier.cluster.arrive.release; "
                     "barrier.cluster.wait.acquire; mov.u32 $0, 0; }")
# Probe A's multicast, issued by tid 0 only (scalar asm runs in every thread). The descriptor is probe_a's first
# param (the 128-byte CUtensorMap, checked in build); cvta.param gives its generic address, as Triton's TMA does.
MC = gl.constexpr("{ .reg .u64 d; .reg .u16 m; .reg .b32 t; .reg .pred p; mov.u32 t, %tid.x; setp.eq.u32 p, t, 0;\n"
                  "mov.u64 d, probe_a_param_0; cvta.param.u64 d, d; mov.u16 m, 3;\n"
                  "@p cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
                  f" [$1], [d, {{{COL0}, {ROW0}}}], [$2], m; mov.u32 $0, 0; }}")


@gluon.jit
def _sreg(code: gl.constexpr):  # scalar asm, run by every thread (the dummy operand: asm needs one)
    return gl.inline_asm_elementwise(code, "=r,r", [0], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _tile(rank, L: gl.constexpr = RL):
    # idx = 64*row + col; a rank-dependent fp32 tile, exact in fp32 (< 2^24)
    r = gl.arange(0, 64, gl.SliceLayout(1, L))
    c = gl.arange(0, 64, gl.SliceLayout(0, L))
    idx = r[:, None] * 64 + c[None, :]
    return idx, (idx * (1 + rank) + 7 * rank).to(gl.float32)


@gluon.jit
def _push(rank, BUF: gl.constexpr, BAR: gl.constexpr, L: gl.constexpr = RL):
    # st.async one fp32 per element into CTA 0's buffer (mapa: our shared address -> CTA 0's), each completing
    # 4 tx bytes on CTA 0's mbarrier; L replicates no element, so the 16384 bytes are counted exactly once
    idx, v = _tile(rank, L)
    base = _sreg("mov.u32 $0, global_smem;")
    gl.inline_asm_elementwise(
        "{ .reg .b32 ra, rb; mapa.shared::cluster.u32 ra, $1, 0; mapa.shared::cluster.u32 rb, $2, 0;\n"
        "st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [ra], $3, [rb]; mov.u32 $0, 0; }",
        "=r,r,r,r", [base + BUF + idx * 4, base + BAR + idx * 0, v], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _receive(rank, recv, bar, out, L: gl.constexpr = RL):
    # pushes may land before the expect: the tx-count goes negative, the phase still waits for this arrive
    mbarrier.expect(bar, 64 * 64 * 4)
    mbarrier.wait(bar, 0)  # Gluon's plain try_wait (acquire.cta), as the real kernel would use
    idx, own = _tile(rank, L)
    gl.store(out + idx, recv.load(L) + own)


@gluon.jit
def probe_a(desc, out, BUF: gl.constexpr, BAR: gl.constexpr):
    buf = gl.allocate_shared_memory(gl.bfloat16, [64, 64], desc.layout)
    bar = gl.allocate_shared_memory(gl.int64, [1], BL)
    mbarrier.init(bar, count=1)
    _sreg(CSYNC)  # CTA 1's barrier is initialised before CTA 0's multicast signals it
    rank = _sreg("mov.u32 $0, %cluster_ctarank;")
    base = _sreg("mov.u32 $0, global_smem;")
    mbarrier.expect(bar, 64 * 64 * 2)  # the whole box lands in each CTA
    if rank == 0:
        gl.inline_asm_elementwise(MC, "=r,r,r", [base + BUF, base + BAR], dtype=gl.int32, is_pure=False, pack=1)
    mbarrier.wait(bar, 0)
    idx, _ = _tile(rank)
    # by asm: gl.store of a CGA-replicated ([[0, 0]]) tensor is masked to CTA 0, so CTA 1's slice would stay unset
    gl.inline_asm_elementwise("st.global.b16 [$1], $2; mov.u32 $0, 0;", "=r,l,h",
                              [(out + rank * 4096 + idx).to(gl.int64), buf.load(RL).to(gl.int16, bitcast=True)],
                              dtype=gl.int32, is_pure=False, pack=1)
    _sreg(CSYNC)  # neither CTA exits while the cluster may still have traffic in flight


@gluon.jit
def _handoff(recv, bar, out, BUF: gl.constexpr, BAR: gl.constexpr, PUSH: gl.constexpr, RECEIVE: gl.constexpr):
    # first barrier: CTA 0's mbarrier is initialised before CTA 1 completes tx on it; last: CTA 0 does not exit
    # while CTA 1 still writes into it. Worker warps never run top-level code, so under warp_specialize every
    # partition calls this, and every thread of both CTAs takes both cluster barriers
    _sreg(CSYNC)
    rank = _sreg("mov.u32 $0, %cluster_ctarank;")
    if PUSH:
        if rank == 1:
            _push(rank, BUF, BAR)
    if RECEIVE:
        if rank == 0:
            _receive(rank, recv, bar, out)
    _sreg(CSYNC)


@gluon.jit
def probe_b(out, BUF: gl.constexpr, BAR: gl.constexpr):
    recv = gl.allocate_shared_memory(gl.float32, [64, 64], FLAT)
    bar = gl.allocate_shared_memory(gl.int64, [1], BL)
    mbarrier.init(bar, count=1)
    _handoff(recv, bar, out, BUF, BAR, True, True)


@gluon.jit
def probe_c(out, BUF: gl.constexpr, BAR: gl.constexpr):
    recv = gl.allocate_shared_memory(gl.float32, [64, 64], FLAT)
    bar = gl.allocate_shared_memory(gl.int64, [1], BL)
    mbarrier.init(bar, count=1)
    # a 4-warp worker (8 warps in all): a 1-warp one is padded with idle warps that would never reach barrier.cluster
    gl.warp_specialize([(_handoff, (recv, bar, out, BUF, BAR, False, True)),  # default partition: CTA 0 receives
                        (_handoff, (recv, bar, out, BUF, BAR, True, False))], [4], [128])  # worker: CTA 1 pushes


# Probe D: the same push as B in a kernel compiled for ONE CTA (no cga_layout anywhere), launched with
# clusters of 2 by the launch's num_ctas alone (``build`` sets it in the packed metadata): each CTA keeps
# its own program id (%ctaid.x), the cluster work is inline PTX. If it passes, a cluster kernel needs no
# CGA layouts on triton 3.6 (NOTES 2026-11-30 17:40 item 2).
RL1 = gl.constexpr(gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0]))
BL1 = gl.constexpr(mbarrier.MBarrierLayout())
FLAT1 = gl.constexpr(gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))


@gluon.jit
def probe_d(out, ids, BUF: gl.constexpr, BAR: gl.constexpr):
    recv = gl.allocate_shared_memory(gl.float32, [64, 64], FLAT1)
    bar = gl.allocate_shared_memory(gl.int64, [1], BL1)
    mbarrier.init(bar, count=1)
    _sreg(CSYNC)
    rank = _sreg("mov.u32 $0, %cluster_ctarank;")
    cluster = _sreg("mov.u32 $0, %clusterid.x;")
    gl.store(ids + gl.program_id(0), rank * 1000 + cluster)
    if rank == 1:
        _push(rank, BUF, BAR, RL1)
    if rank == 0:
        _receive(rank, recv, bar, out + cluster * 4096, RL1)
    _sreg(CSYNC)


# name: (kernel, its non-constexpr arguments' types); every kernel takes the offsets BUF and BAR as constexprs
PROBES = {"A": (probe_a, {"desc": f"tensordesc<bf16[64, 64],{NVMMA!r}>", "out": "*bf16"}),
          "B": (probe_b, {"out": "*fp32"}), "C": (probe_c, {"out": "*fp32"}),
          "D": (probe_d, {"out": "*fp32", "ids": "*i32"})}


def smem_offsets(ck):
    """Each local_alloc's allocation.offset (hidden by Gluon), in order: the allocation pass re-run on the TTGIR."""
    from triton._C.libtriton import ir, nvidia, passes
    ctx = ir.context()
    ir.load_dialects(ctx)
    nvidia.load_dialects(ctx)
    with tempfile.NamedTemporaryFile("w", suffix=".ttgir", delete=False) as f:
        f.write(ck.asm["ttgir"])
    mod = ir.parse_mlir_module(f.name, ctx)
    os.unlink(f.name)
    mod.context = ctx
    pm = ir.pass_manager(ctx)
    passes.ttgpuir.add_allocate_warp_groups(pm)
    passes.convert.add_scf_to_cf(pm)
    passes.gluon.add_inliner(pm)
    nvidia.passes.ttgpuir.add_allocate_shared_memory_nv(pm, 90, 87)
    pm.run(mod, "offsets")
    return [int(m) for m in re.findall(r"allocation\.offset = (\d+) : i32\} : \(\) -> !ttg\.memdesc", str(mod))]


def build(name):
    """Compile with placeholder offsets, read the real ones, recompile with them and check they held."""
    fn, types = PROBES[name]
    sig = {a: types.get(a, "constexpr") for a in fn.arg_names}  # in argument order: types are read by position
    ctas = 1 if name == "D" else 2  # D: compiled for one CTA, clustered by the launch alone
    compile_ = lambda buf, bar: triton.compile(  # noqa: E731
        GluonASTSource(fn, sig, {"BUF": buf, "BAR": bar}), target=TARGET, options=dict(num_ctas=ctas, num_warps=4))
    offs = smem_offsets(compile_(0, 0))
    assert len(offs) == 2, f"expected 2 allocations (buffer, barrier), found offsets {offs}"
    ck = compile_(*offs)
    ptx = ck.asm["ptx"]  # host-side consistency checks of what the inline asm assumes:
    assert smem_offsets(ck) == offs, "allocation offsets moved after feeding them back"
    assert ck.metadata.name == fn.__name__, "not the probe's kernel"
    assert (".reqnctapercluster 2" in ptx) == (ctas == 2), "the cluster is not where the probe expects it"
    if name == "D":  # the launcher reads (num_warps, num_ctas, shared): gridDim.x × 2 in clusters of 2
        ck.packed_metadata = (ck.metadata.num_warps, 2, ck.metadata.shared)
    assert name != "A" or ".param .align 64 .b8 probe_a_param_0[128]" in ptx, "the descriptor is not param 0"
    return ck, offs


def run_probe(name):
    """In the child: PASS or FAIL <detail>."""
    import torch
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    ck, (buf, bar) = build(name)
    launch = ck[(1, 1, 1)]  # one program = one cluster of 2 CTAs (the launcher doubles grid x); constexprs passed too
    if name == "A":
        src = torch.randn(128, 192, device="cuda").to(torch.bfloat16)
        out = torch.full((2, 64, 64), float("nan"), device="cuda", dtype=torch.bfloat16)
        launch(TensorDescriptor(src, list(src.shape), list(src.stride()), [64, 64], NVMMA), out, buf, bar)
        torch.cuda.synchronize()  # an async fault surfaces here, as the child's ERROR
        want = src[ROW0:ROW0 + 64, COL0:COL0 + 64]
        bad = [r for r in range(2) if not torch.equal(out[r], want)]
        return f"FAIL CTA {bad} slice differs ({int((out[bad[0]] != want).sum())} of 4096)" if bad else "PASS"
    if name == "D":  # two clusters of 2: each CTA says (rank, cluster), rank 0 adds rank 1's push
        out = torch.full((2, 64, 64), float("nan"), device="cuda")
        ids = torch.full((4,), -1, device="cuda", dtype=torch.int32)
        ck[(2, 1, 1)](out, ids, buf, bar)
        torch.cuda.synchronize()
        want = torch.arange(4096, device="cuda", dtype=torch.float32).view(64, 64) * 3 + 7
        wrong = int(((out != want) | out.isnan()).sum())
        if ids.tolist() != [0, 1000, 1, 1001]:
            return f"FAIL (rank·1000 + cluster) by program id: {ids.tolist()}, want [0, 1000, 1, 1001]"
        return f"FAIL {wrong} of 8192 wrong" if wrong else "PASS"
    out = torch.full((64, 64), float("nan"), device="cuda")
    launch(out, buf, bar)
    torch.cuda.synchronize()
    want = torch.arange(4096, device="cuda", dtype=torch.float32).view(64, 64) * 3 + 7  # idx (CTA 0) + 2 idx + 7
    wrong = int(((out != want) | out.isnan()).sum())
    return f"FAIL {wrong} of 4096 wrong, [0,1] got {out[0, 1].item()} want {want[0, 1].item()}" if wrong else "PASS"


def compile_only():
    # the PTX instructions each probe hinges on; a cubin means ptxas accepted the PTX for sm_90
    keys = ["multicast::cluster", "mapa.shared::cluster", "st.async", "barrier.cluster.arrive", "fence.mbarrier_init",
            "%cluster_ctarank", "mbarrier.try_wait", "expect_tx", "st.global", "setmaxnreg"]
    for name in PROBES:
        try:
            ck, offs = build(name)
            hits = ", ".join(f"{k} x{ck.asm['ptx'].count(k)}" for k in keys if k in ck.asm["ptx"])
            threads = re.search(r"\.reqntid (\d+)", ck.asm["ptx"]).group(1)
            print(f"probe {name}: ok, cubin {len(ck.asm['cubin'])} B, {threads} threads, offsets {offs}: {hits}")
        except Exception as e:  # noqa: BLE001 - report it and go on with the next probe
            print(f"probe {name}: ERROR {type(e).__name__}: {str(e.__cause__ or e).strip()[-600:]}")


def parse_args(argv=None):
    """The arguments, checked before any GPU work (a usage error naming the argument otherwise)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=".", help="folder for cluster_probe.json")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per probe")
    ap.add_argument("--compile-only", action="store_true", help="no GPU: compile each probe for sm_90")
    ap.add_argument("--probe", choices=list(PROBES), help=argparse.SUPPRESS)  # the child's entry point
    args = ap.parse_args(argv)
    if not args.timeout > 0:
        ap.error(f"--timeout must be > 0 seconds, got {args.timeout}")
    return args


def main():
    args = parse_args()
    if args.compile_only:
        return compile_only()
    if args.probe:
        try:
            print("RESULT", run_probe(args.probe), flush=True)
        except Exception as e:  # noqa: BLE001 - the parent reports it
            print("RESULT ERROR", f"{type(e).__name__}: {str(e).strip()[:300]}".replace("\n", " | "), flush=True)
        return
    import torch
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        found = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device"
        print(f"cluster_probe needs an sm_90 GPU (H100/H200); found {found}")
        return
    results = {}
    for name in PROBES:
        try:  # a fresh process per probe: a hung or faulted kernel leaves the CUDA context unusable
            p = subprocess.run([sys.executable, os.path.abspath(__file__), "--probe", name],
                               capture_output=True, text=True, timeout=args.timeout)
            lines = [ln[7:] for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
            tail = (p.stderr.strip().splitlines() or [f"exit code {p.returncode}"])[-1]
            results[name] = lines[-1] if lines else f"ERROR child died: {tail[:300]}"
        except subprocess.TimeoutExpired:
            results[name] = "TIMEOUT"
        print(f"probe {name}: {results[name]}", flush=True)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "cluster_probe.json")
    with open(path, "w") as f:
        json.dump({"triton": triton.__version__, "torch": torch.__version__, "device": torch.cuda.get_device_name(),
                   "probes": results}, f, indent=1)
    print("wrote", path)


if __name__ == "__main__":
    main()
