"""How many CTAs of 208 KB of shared memory run at once on an sm_90 GPU, launched alone or as clusters of two (the
launch's num_ctas set in the packed metadata, as cluster_probe.py's probe D): 792 CTAs each spin 200 us and record
(smid, start, end). ``PYTHONPATH=. python benchmarks/experiments/cluster_occupancy.py`` (``compile``: no GPU, build
only). NOTES 2026-11-30: 132 at once both ways on an H200."""
import sys, json
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource

L = gl.constexpr(gl.BlockedLayout([1], [32], [4], [0]))
S = gl.constexpr(gl.SwizzledSharedLayout(1, 1, 1, [0]))


@gluon.jit
def _u64(code: gl.constexpr):
    return gl.inline_asm_elementwise(code, "=l,r", [0], dtype=gl.int64, is_pure=False, pack=1)


@gluon.jit
def occ(out, spin_ns, KB: gl.constexpr):  # (KB: a label; the three buffers below make the 208 KB)
    a = gl.allocate_shared_memory(gl.int32, [32768], S)  # 128 KB
    b = gl.allocate_shared_memory(gl.int32, [16384], S)  # 64 KB
    c = gl.allocate_shared_memory(gl.int32, [4096], S)  # 16 KB
    x = gl.arange(0, 128, layout=L)
    a.slice(0, 128).store(x)
    b.slice(0, 128).store(x)
    c.slice(0, 128).store(x)
    t0 = _u64("mov.u64 $0, %globaltimer;")
    t = t0
    while t - t0 < spin_ns:
        t = _u64("mov.u64 $0, %globaltimer;")
    sm = _u64("{ .reg .u32 s; mov.u32 s, %smid; cvt.u64.u32 $0, s; }")
    pid = gl.program_id(0)
    y = a.slice(0, 128).load(L) + b.slice(0, 128).load(L) + c.slice(0, 128).load(L)
    keep = gl.sum(y, axis=0)  # the buffers stay allocated
    gl.store(out + pid * 4, sm)
    gl.store(out + pid * 4 + 1, t0)
    gl.store(out + pid * 4 + 2, t)
    gl.store(out + pid * 4 + 3, keep.to(gl.int64))


def build():
    sig = {"out": "*i64", "spin_ns": "i64", "KB": "constexpr"}
    return triton.compile(GluonASTSource(occ, sig, {"KB": 208}), target=GPUTarget("cuda", 90, 32),
                          options=dict(num_warps=4))


if __name__ == "__main__":
    ck = build()
    print("shared", ck.metadata.shared)
    if sys.argv[1:] == ["compile"]:
        sys.exit()
    import torch
    res = {}
    for ctas in (1, 2):
        n = 264 * 3  # CTAs: three waves of 132 if one a SM
        out = torch.zeros(n * 4, dtype=torch.int64, device="cuda")
        ck.packed_metadata = (ck.metadata.num_warps, ctas, ck.metadata.shared)
        for _ in range(2):  # the second run timed
            ck[(n // ctas, 1, 1)](out, 200_000, 208)
            torch.cuda.synchronize()
        r = out.view(n, 4).cpu()
        sms, t0, t1 = r[:, 0], r[:, 1], r[:, 2]
        events = sorted([(int(a), 1) for a in t0] + [(int(b), -1) for b in t1])
        cur = peak = 0
        for _, d in events:
            cur += d
            peak = max(peak, cur)
        span = (int(t1.max()) - int(t0.min())) / 1e3
        res[ctas] = dict(peak=peak, distinct_sms=len(set(sms.tolist())), span_us=span)
        print(f"num_ctas {ctas}: peak concurrent CTAs {peak}, distinct SMs {len(set(sms.tolist()))}, "
              f"{n} CTAs of 200 us in {span:.0f} us (ideal {n / 132 * 200:.0f})", flush=True)
    print(json.dumps(res))
