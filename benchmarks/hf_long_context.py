"""transformers models at long context on attn_implementation="fa_lite": no (L, S) mask anywhere.

    python benchmarks/hf_long_context.py [--out benchmarks/results] [--tokens 64k]

Two tiny-width models with their real layer structure: Mistral (every layer a sliding window)
and gpt-oss (sliding and full layers, sinks, mixture of experts) on the GPU. For each:

1. logits of a short left-padded batch (2 rows of 512 tokens, window 128), ours against the same
   model with attn_implementation="eager", both in float32, on the valid positions (rel err < 1e-4:
   the same math, so the only differences are float32 rounding);
2. in bf16, forward + backward (a loss on the valid tokens) of a left-padded batch of 2 rows (a quarter of
   the second row is padding) at --tokens / 2 and --tokens tokens in all: the peak memory above
   the model's. Linear memory gives peak(2N) ≈ 2·peak(N); a dense (B, 1, n, n) mask over rows of
   n tokens adds a term quadratic in n, and peak(2N) − 2·peak(N) is then at least half of the
   bool mask at 2N. The checks: that excess stays under 1/8 of that mask, attention_core saw
   ranges and never a mask, and nothing fell back.

Prints a table, writes JSON under --out, exits 1 if a check fails. About a minute on an H100
(the kernels run with their first fitting config: FLASHATTN_LITE_AUTOTUNE=0, as memory does not
depend on tuning).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("FLASHATTN_LITE_AUTOTUNE", "0")

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import flashattn_lite.ops.attention as attn_ops  # noqa: E402
from flashattn_lite import _log  # noqa: E402
from flashattn_lite.bench.common import add_run_arguments, format_table, parse_size, write_json  # noqa: E402
from flashattn_lite.integrations import hf  # noqa: E402

VOCAB, WINDOW, SHORT = 256, 128, 512


def _config(family: str):
    import transformers
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=131072,
                  sliding_window=WINDOW, initializer_range=0.3, pad_token_id=0, attention_dropout=0.0)
    if family == "mistral":
        return transformers.MistralConfig(**common)
    # Every token goes to both experts: no routing choice for bf16 rounding to flip against eager.
    return transformers.GptOssConfig(num_local_experts=2, num_experts_per_tok=2, **common)


def _models(family: str):
    """(eager, ours), float32, with the same weights; gpt-oss sinks drawn large enough to matter."""
    import transformers
    torch.manual_seed(0)
    ref = transformers.AutoModelForCausalLM.from_config(_config(family), attn_implementation="eager")
    if family == "gpt_oss":
        with torch.no_grad():
            for layer in ref.model.layers:
                layer.self_attn.sinks.normal_(0.0, 2.0)
    ours = transformers.AutoModelForCausalLM.from_config(_config(family), attn_implementation=hf.ATTN_IMPLEMENTATION)
    ours.load_state_dict(ref.state_dict())
    return ref.cuda().eval(), ours.cuda()


def _batch(row_len: int):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, VOCAB, (2, row_len), generator=g)
    am = torch.ones(2, row_len, dtype=torch.long)
    am[1, :row_len // 4] = 0
    ids[am == 0] = 0
    return ids.cuda(), am.cuda()


def _short_check(ref, ours) -> float:
    ids, am = _batch(SHORT)
    keep = am.bool()
    with torch.no_grad():
        a = ref(input_ids=ids, attention_mask=am).logits[keep].float()
        b = ours(input_ids=ids, attention_mask=am).logits[keep].float()
    return ((a - b).norm() / a.norm()).item()


def _train_step_peak(model, total_tokens: int) -> tuple[int, float]:
    """Bytes allocated at the peak of one forward + backward above what was allocated before, and
    the step's seconds."""
    ids, am = _batch(total_tokens // 2)
    labels = ids.masked_fill(am == 0, -100)
    model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    model(input_ids=ids, attention_mask=am, labels=labels).loss.backward()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base, time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    ap.add_argument("--tokens", type=parse_size, default=64 * 1024, help="tokens in the larger batch (2 rows)")
    add_run_arguments(ap)  # accepted for benchmarks/gpu_check.sh; this run is short either way
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("hf_long_context: needs a CUDA device")

    seen = []
    core = attn_ops.attention_core

    def recording_core(q, k, v, **kw):
        seen.append((kw.get("attn_mask") is None, kw.get("k_ranges") is not None))
        return core(q, k, v, **kw)

    attn_ops.attention_core = recording_core
    rows, ok = [], True
    for family in ("mistral", "gpt_oss"):
        ref, ours = _models(family)
        err = _short_check(ref, ours)  # float32 on both sides: the same math, so equal to ~1e-6
        del ref
        ours = ours.to(torch.bfloat16).train()
        _train_step_peak(ours, 2 * SHORT)  # compile the kernels outside the measurement
        seen.clear()
        fallbacks = sum(n for (where, _), n in _log.fallback_counts().items() if where == "hf")
        (p1, t1), (p2, t2) = (_train_step_peak(ours, n) for n in (args.tokens // 2, args.tokens))
        fallbacks = sum(n for (where, _), n in _log.fallback_counts().items() if where == "hf") - fallbacks
        row_len = args.tokens // 2
        excess = p2 - 2 * p1
        checks = {
            "logits_vs_eager": err < 1e-4,
            "memory_linear": excess < 2 * row_len ** 2 / 8,
            "ranges_no_mask": bool(seen) and all(no_mask and ranges for no_mask, ranges in seen),
            "no_fallback": fallbacks == 0,
        }
        ok &= all(checks.values())
        rows.append(dict(family=family, logits_rel_err=err, tokens_n=args.tokens // 2, peak_mib_n=p1 / 2 ** 20,
                         tokens_2n=args.tokens, peak_mib_2n=p2 / 2 ** 20, peak_ratio=p2 / p1,
                         dense_mask_mib_2n=2 * row_len ** 2 / 2 ** 20, step_s_n=t1, step_s_2n=t2,
                         kernel_calls=len(seen), **checks))
        print(format_table(rows[-1:], list(rows[-1])), flush=True)
        del ours
        torch.cuda.empty_cache()
    path = write_json(args.out, "hf_long_context", rows, window=WINDOW, short_row_len=SHORT)
    summary = ["family", "logits_rel_err", "peak_mib_n", "peak_mib_2n", "peak_ratio", "dense_mask_mib_2n",
               "step_s_2n", "memory_linear", "ranges_no_mask", "no_fallback"]
    print("\n" + format_table(rows, summary))
    print(f"wrote {path}; {'all checks passed' if ok else 'A CHECK FAILED'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
