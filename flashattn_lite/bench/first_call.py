"""First-call cost and per-call host cost, each first call in a fresh process.

Cases (attention: bf16, B 1, H 16, N 4096, d 128, causal, forward then backward, each timed to a
synchronize):

- ``cold``: an empty Triton cache (``TRITON_CACHE_DIR`` a new temporary folder): compiling;
- ``warm``: a new process on the cache ``cold`` filled: loading compiled kernels only;
- ``new-length``: in the ``warm`` process, then the same call at N + 1: what a new length costs;
- with ``--autotune`` also ``FLASHATTN_LITE_AUTOTUNE=1`` (timing configs, then the disk cache in
  the next process: ``tuned-cold``, ``tuned-warm``).

Each child first creates the CUDA context (``cuda_context_s``, timed apart: neither side of the
comparison pays it), then torch's own first calls (an SDPA forward+backward: its kernels' loading,
autograd's lazy imports) run and are reported apart (``torch_first_s``), so the rest is what this
package costs; ``torch_first_s`` and ours' first calls are thus both timed in a process whose CUDA
context exists.

And eager ``decode`` per call (Hq 32, Hkv 8, d 128, bf16; B 1 4k, B 1 32k, B 8 4k) against SDPA
flash and cuDNN on the same cache: wall-clock per call over a loop of calls with one synchronize
at the end (at these sizes the host path is most of it). Each implementation is warmed up, timed
once in an untimed round, then in DECODE_ROUNDS rounds in ``common.balanced_rounds`` orders (the
best round kept, every round recorded in ``rounds_us``); an SDPA backend is forced around a
round's loop, not inside each timed call (entering ``sdpa_kernel`` costs ~8 µs of host time).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch

from .common import BenchArgumentError, ResultWriter, add_run_arguments, format_table, in_rounds, settings

COLUMNS = ["case", "cuda_context_s", "torch_first_s", "first_fwd_s", "first_bwd_s", "compiled", "new_len_fwd_s",
           "new_len_bwd_s", "new_len_compiled", "impl", "us_per_call"]
DEFAULTS = dict(length=4096, decode_calls=300, autotune=False, profile=False)
QUICK = dict(decode_calls=100)
DECODE_CASES = [("B1-4k", 1, 4096), ("B1-32k", 1, 32768), ("B8-4k", 8, 4096)]
CHILD_TIMEOUT_S = 240
DECODE_ROUNDS = 3


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--length", type=int, default=None, help="attention sequence length (default 4096)")
    parser.add_argument("--decode-calls", type=int, default=None, help="decode calls per timing (default 300)")
    parser.add_argument("--autotune", action="store_true", default=None,
                        help="also the FLASHATTN_LITE_AUTOTUNE=1 cases (timing, then the disk cache)")
    parser.add_argument("--profile", action="store_true", default=None,
                        help="write a cProfile summary of each attention child's first calls under --out "
                             "(profiling slows the timed calls)")
    add_run_arguments(parser)


def run(args) -> list[dict]:
    if not torch.cuda.is_available():
        raise BenchArgumentError("first-call measures compiles and CUDA launches: it needs a GPU")
    s = settings(args, DEFAULTS, QUICK)
    if s["length"] < 16 or s["decode_calls"] < 1:
        raise BenchArgumentError("--length must be ≥ 16 and --decode-calls ≥ 1")
    writer = ResultWriter(args.out, "first_call", columns=COLUMNS, budget_s=args.time_budget,
                          meta={"settings": s, "torch_first": "torch's first SDPA fwd+bwd, timed after the CUDA "
                                                              "context was created (cuda_context_s, apart)"})
    print("Each child creates the CUDA context first (cuda_context_s, timed apart): torch_first_s (torch's first "
          "SDPA fwd+bwd) and ours' first calls are both timed after it.", flush=True)
    with writer, tempfile.TemporaryDirectory() as tmp:
        modes = [("", {})] + ([("tuned-", {"FLASHATTN_LITE_AUTOTUNE": "1"})] if s["autotune"] else [])
        for prefix, extra in modes:
            env = {**os.environ, **extra, "TRITON_CACHE_DIR": os.path.join(tmp, prefix + "triton"),
                   "FLASHATTN_LITE_CACHE_DIR": os.path.join(tmp, prefix + "tuning")}
            for case in ("cold", "warm"):
                if writer.start(case=prefix + case):
                    job = {"what": "attention", "length": s["length"], "new_length": case == "warm"}
                    if s["profile"] and args.out:
                        job["profile"] = os.path.join(args.out, f"first_call_profile_{prefix}{case}.txt")
                    row = _child(job, env)
                    writer.add({"case": prefix + case, **row})
        for name, batch, length in DECODE_CASES:
            if writer.start(case=f"decode {name}"):
                for row in _child({"what": "decode", "batch": batch, "length": length,
                                   "calls": s["decode_calls"]}, dict(os.environ)):
                    writer.add({"case": f"decode {name}", **row})
        writer.finish()
    print(format_table(writer.rows, COLUMNS))
    return writer.rows


def _child(job: dict, env: dict):
    """Run ``job`` in a fresh interpreter; its last stdout line is the JSON result."""
    proc = subprocess.run([sys.executable, "-m", __name__, json.dumps(job)], env=env, capture_output=True,
                          text=True, timeout=CHILD_TIMEOUT_S)
    if proc.returncode != 0:
        raise RuntimeError(f"first-call child {job} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _timed(fn) -> float:
    _sync()
    t0 = time.perf_counter()
    fn()
    _sync()
    return time.perf_counter() - t0


def _create_cuda_context(device: str) -> float | None:
    """Seconds to create the CUDA context (and the caching allocator's first block, a first kernel):
    done before any first call is timed, so that neither torch's nor ours pays it. None off CUDA."""
    if torch.device(device).type != "cuda":
        return None
    t0 = time.perf_counter()
    torch.cuda.init()
    torch.zeros(1, device=device).add_(1)
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def _cache_entries() -> int:
    """Compiled kernels in this process's Triton cache (each compile adds one ``*.json``)."""
    root = os.environ.get("TRITON_CACHE_DIR", "")
    return sum(name.endswith(".json") and not name.startswith("__grp__")
               for _, _, names in os.walk(root) for name in names) if root else -1


def _attention_job(job: dict) -> dict:
    if job.get("profile"):
        import cProfile
        import io
        import pstats
        profiler = cProfile.Profile()
        profiler.enable()
        try:
            return _attention_job({**job, "profile": None})
        finally:
            profiler.disable()
            text = io.StringIO()
            pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(45)
            with open(job["profile"], "w") as f:
                f.write(text.getvalue())
    import flashattn_lite as fa

    device = job.get("device", "cuda")
    # The CUDA context first, timed apart: neither torch's first calls nor ours pay it. Then torch's
    # own first calls, timed apart: SDPA, and the first backward (autograd imports sympy then, 0.4 s
    # with compiled bytecode, ~4 s without it).
    context_s = _create_cuda_context(device)
    q, k, v = (torch.randn(1, 16, job["length"], 128, device=device, dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    torch_first = _timed(lambda: torch.nn.functional.scaled_dot_product_attention(
        q, k, v, is_causal=True).backward(torch.ones_like(q)))

    def step(n):
        q, k, v = (torch.randn(1, 16, n, 128, device=device, dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        out = {}
        o = None

        def fwd():
            nonlocal o
            o = fa.attention(q, k, v, causal=True)
        out["fwd"] = _timed(fwd)
        out["bwd"] = _timed(lambda: o.backward(torch.ones_like(o)))
        return out

    before = _cache_entries()
    first = step(job["length"])
    row = {"cuda_context_s": context_s, "torch_first_s": torch_first, "first_fwd_s": first["fwd"],
           "first_bwd_s": first["bwd"], "compiled": _cache_entries() - before}
    if job["new_length"]:
        before = _cache_entries()
        again = step(job["length"] + 1)
        row.update(new_len_fwd_s=again["fwd"], new_len_bwd_s=again["bwd"], new_len_compiled=_cache_entries() - before)
    return row


def _decode_job(job: dict) -> list[dict]:
    import flashattn_lite as fa
    from .decode import _backend_context, _sdpa_call, _sdpa_peers
    b, n, calls = job["batch"], job["length"], job["calls"]
    device = job.get("device", "cuda")
    q = torch.randn(b, 32, 1, 128, device=device, dtype=torch.bfloat16)
    k, v = (torch.randn(b, 8, n, 128, device=device, dtype=torch.bfloat16) for _ in range(2))
    lens = torch.full((b,), n, device=device, dtype=torch.int32)
    impls = {"ours": (lambda: fa.decode(q, k, v, lens), None)}
    for name, backend in _sdpa_peers(q.device):
        # SDPA alone: its backend is forced around each round's loop below, not at every call.
        fn, how = _sdpa_call(q, k, v, backend, inner_context=False)
        if fn is not None:
            impls[f"{name} ({how})"] = (fn, backend)
    for fn, backend in impls.values():
        with _backend_context(backend):
            fn()
    def measure(name):
        fn, backend = impls[name]
        with _backend_context(backend):
            return _timed(lambda: [fn() for _ in range(calls)]) / calls * 1e6
    times, orders = in_rounds(impls, DECODE_ROUNDS, measure)
    return [{"impl": name, "us_per_call": min(times[name]), "rounds_us": times[name],
             "rounds_position": [order.index(name) for order in orders]} for name in impls]


if __name__ == "__main__":
    job = json.loads(sys.argv[1])
    result = _attention_job(job) if job["what"] == "attention" else _decode_job(job)
    print(json.dumps(result))
