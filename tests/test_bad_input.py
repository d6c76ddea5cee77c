"""Every public function and every CLI subcommand, called with one bad argument at a time: wrong type,
rank, shape, dtype, device or value. Each must raise before launching anything, with an error of the
expected class whose message names the argument (the CLI: exit status 2, the option named on stderr).

The table is data: a new argument joins as one ``Case`` row. Each row starts from a valid call (its
``base`` factory; ``test_base_calls_are_valid`` runs each unchanged) and replaces one argument.
A "meta" tensor stands in for a tensor on another device. Rows whose function or parameter does
not exist yet are skipped (they start running when it lands).
"""
from __future__ import annotations

import argparse
import inspect
import re
import signal
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable

import pytest
import torch

import flashattn_lite as fl
from conftest import DEVICE, run_cli
from flashattn_lite import cli

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

T = lambda *shape, dtype=torch.float16: torch.randn(*shape).to(DEVICE, dtype)  # noqa: E731
I32 = lambda values: torch.tensor(values, dtype=torch.int32, device=DEVICE)  # noqa: E731
META = lambda t: torch.empty(t.shape, dtype=t.dtype, device="meta")  # noqa: E731


@dataclass
class Case:
    """``call(**base())`` is valid; ``call(**{**base(), arg: bad})`` must raise ``exc`` naming ``name``.
    ``bad`` may be a function of the base kwargs (to derive the bad value from the good one)."""
    fn: str
    call: Callable[..., Any]
    base: Callable[[], dict]
    arg: str
    bad: Any
    exc: type
    name: str
    why: str

    @property
    def id(self) -> str:
        return f"{self.fn}-{self.arg}-{self.why}"


# ------------------------------------------------------------------ valid calls

def attn_base():
    return dict(q=T(1, 4, 5, 8), k=T(1, 2, 7, 8), v=T(1, 2, 7, 8))


def varlen_base():
    return dict(q=T(6, 4, 8), k=T(9, 2, 8), v=T(9, 2, 8), cu_seqlens_q=I32([0, 2, 6]), cu_seqlens_k=I32([0, 4, 9]),
                check_seqlens=True)


def varlen_no_keys_base():
    """Every key sequence empty: o = 0 without a kernel, but k and v checked as in any other call."""
    return dict(q=T(6, 4, 8), k=T(0, 2, 8), v=T(0, 2, 8), cu_seqlens_q=I32([0, 2, 6]), cu_seqlens_k=I32([0, 0, 0]),
                check_seqlens=True)


def softmax_base():
    return dict(x=T(3, 9))


def merge_base():
    return dict(o_a=T(1, 2, 3, 8), lse_a=T(1, 2, 3, dtype=torch.float32), o_b=T(1, 2, 3, 8),
                lse_b=T(1, 2, 3, dtype=torch.float32))


def stacked_base():
    return dict(o=T(3, 1, 2, 3, 8), lse=T(3, 1, 2, 3, dtype=torch.float32))


def decode_base():
    return dict(q=T(2, 4, 1, 8), k_cache=T(2, 2, 10, 8), v_cache=T(2, 2, 10, 8), cache_seqlens=I32([3, 10]),
                check_values=True)


def paged_base():
    return dict(q=T(2, 4, 1, 8), k_cache=T(5, 2, 4, 8), v_cache=T(5, 2, 4, 8), cache_seqlens=I32([3, 7]),
                block_table=I32([[4, -1], [0, 2]]), check_values=True)


def sdpa_base():
    return dict(query=T(1, 4, 5, 8), key=T(1, 2, 7, 8), value=T(1, 2, 7, 8), enable_gqa=True)


def module_call(**kw):
    return fl.nn.FlashAttention()(**kw)


def module_base():
    return dict(attn_mask=torch.ones(5, 7, dtype=torch.bool, device=DEVICE), **attn_base())


def mha_new(**kw):
    return fl.nn.MultiheadAttention(**kw)


def mha_base():
    return dict(embed_dim=16, num_heads=4, num_kv_heads=2)


def mha_forward(*, x, **kw):
    return fl.nn.MultiheadAttention(16, 4, 2, rotary=True).to(DEVICE)(x, **kw)


def mha_forward_base():
    return dict(x=T(2, 5, 16, dtype=torch.float32))


def with_(key, fn):
    """A bad value computed from the base kwargs' ``key`` entry."""
    return lambda kw: fn(kw[key])


def grad(t):
    return t.float().requires_grad_()


# ------------------------------------------------------------------ the table

ATTN = ("attention", fl.attention, attn_base)
VARLEN = ("attention_varlen", getattr(fl, "attention_varlen", None), varlen_base)
NO_KEYS = ("attention_varlen-no-keys", getattr(fl, "attention_varlen", None), varlen_no_keys_base)
SOFTMAXES = [(name, getattr(fl, name), softmax_base) for name in ("softmax", "log_softmax", "logsumexp")]
MERGE = ("merge_attention_states", fl.merge_attention_states, merge_base)
STACKED = ("merge_attention_states_stacked", fl.merge_attention_states_stacked, stacked_base)
DECODE = ("decode", fl.decode, decode_base)
PAGED = ("decode-paged", fl.decode, paged_base)
SDPA = ("scaled_dot_product_attention", fl.scaled_dot_product_attention, sdpa_base)
MODULE = ("FlashAttention", module_call, module_base)
MHA = ("MultiheadAttention", mha_new, mha_base)
MHA_FWD = ("MultiheadAttention.forward", mha_forward, mha_forward_base)


def rows(target, *entries):
    fn, call, base = target
    return [Case(fn, call, base, *e) for e in entries]


def score_option_rows(target):
    """window, softcap, sinks, alibi_slopes: shared by attention and attention_varlen (Hq = 4)."""
    return rows(
        target,
        ("window", "left", TypeError, "window", "not-a-pair"),
        ("window", (3,), TypeError, "window", "one-side"),
        ("window", (-2, 0), ValueError, "window", "negative"),
        ("window", (0, 1.5), TypeError, "window", "float-side"),
        ("softcap", -1.0, ValueError, "softcap", "negative"),
        ("softcap", float("nan"), ValueError, "softcap", "nan"),
        ("softcap", float("inf"), ValueError, "softcap", "inf"),
        ("softcap", "1", TypeError, "softcap", "str"),
        ("sinks", [0.0] * 4, TypeError, "sinks", "list"),
        ("sinks", lambda kw: T(5, dtype=torch.float32), ValueError, "sinks", "wrong-heads"),
        ("sinks", lambda kw: T(1, 4, dtype=torch.float32), ValueError, "sinks", "rank-2"),
        ("sinks", lambda kw: torch.zeros(4, dtype=torch.int32, device=DEVICE), TypeError, "sinks", "int"),
        ("sinks", lambda kw: torch.zeros(4, device="meta"), ValueError, "sinks", "meta-device"),
        ("alibi_slopes", lambda kw: T(3, dtype=torch.float32), ValueError, "alibi_slopes", "wrong-heads"),
        ("alibi_slopes", lambda kw: T(4), TypeError, "alibi_slopes", "fp16"),
        ("alibi_slopes", lambda kw: torch.zeros(4, device="meta"), ValueError, "alibi_slopes", "meta-device"),
        ("alibi_slopes", lambda kw: T(4, dtype=torch.float32).requires_grad_(), ValueError, "alibi_slopes",
         "requires-grad"),
        ("causal", "yes", TypeError, "causal", "str"),
        ("causal", 1, TypeError, "causal", "int"),
        ("scale", "big", TypeError, "scale", "str"),
        ("scale", float("nan"), ValueError, "scale", "nan"),
        ("scale", float("inf"), ValueError, "scale", "inf"),
        ("scale", -3e38, ValueError, "scale", "past-float32"),  # finite in float32, scale·log2 e is inf
        ("scale", lambda kw: torch.ones(2), ValueError, "scale", "tensor-of-2"),
        ("scale", lambda kw: torch.tensor(0.5, requires_grad=True), TypeError, "scale", "requires-grad"),
        ("return_lse", "yes", TypeError, "return_lse", "str"),
    )


CASES: list[Case] = [
    *rows(ATTN,
          ("q", lambda kw: kw["q"].tolist(), TypeError, "q", "list"),
          ("q", with_("q", lambda q: q[0]), ValueError, "q", "rank-3"),
          ("q", with_("q", lambda q: q.to(torch.int32)), TypeError, "q", "int32"),
          ("q", with_("q", lambda q: q.double()), TypeError, "q", "float64"),
          ("q", with_("q", lambda q: q[:, :, :0]), ValueError, "q", "empty"),
          ("q", lambda kw: T(1, 4, 5, 300), ValueError, "q", "head-dim-300"),
          ("q", lambda kw: T(1, 3, 5, 8), ValueError, "q", "heads-not-multiple"),
          ("k", with_("k", lambda k: k.float()), ValueError, "k", "dtype-mismatch"),
          ("k", with_("k", META), ValueError, "k", "meta-device"),
          ("k", with_("k", lambda k: k.expand(2, -1, -1, -1)), ValueError, "k", "batch"),
          ("k", with_("k", lambda k: k[..., :4]), ValueError, "k", "head-dim"),
          ("v", with_("v", lambda v: v[:, :, :3]), ValueError, "v", "length"),
          ("v", with_("v", lambda v: v[..., :0]), ValueError, "v", "head-dim-0"),
          ("v", lambda kw: T(1, 2, 7, 257), ValueError, "v", "head-dim-257"),
          ("v", with_("v", META), ValueError, "v", "meta-device")),
    *score_option_rows(ATTN),
    *rows(VARLEN,
          ("q", lambda kw: T(1, 6, 4, 8), ValueError, "q", "rank-4"),
          ("q", lambda kw: T(0, 4, 8), ValueError, r"q must hold at least one row.*\(0, 4, 8\)", "no-rows"),
          ("k", with_("k", lambda k: k.float()), ValueError, "k", "dtype-mismatch"),
          ("cu_seqlens_q", with_("cu_seqlens_q", lambda t: t.long()), TypeError, "cu_seqlens_q", "int64"),
          ("cu_seqlens_q", [0, 2, 6], TypeError, "cu_seqlens_q", "list"),
          ("cu_seqlens_q", with_("cu_seqlens_q", META), ValueError, "cu_seqlens_q", "meta-device"),
          ("cu_seqlens_q", lambda kw: I32([[0, 2, 6]]), ValueError, "cu_seqlens_q", "rank-2"),
          ("cu_seqlens_q", lambda kw: I32([1, 2, 6]), ValueError, "cu_seqlens_q", "not-from-0"),
          ("cu_seqlens_q", lambda kw: I32([0, 2, 5]), ValueError, "cu_seqlens_q", "not-to-total"),
          ("cu_seqlens_k", lambda kw: I32([0, 5, 4]), ValueError, "cu_seqlens_k", "decreasing"),
          ("cu_seqlens_k", lambda kw: I32([0, 9]), ValueError, "cu_seqlens_k", "batch-mismatch"),
          ("max_seqlen_q", 0, ValueError, "max_seqlen_q", "zero"),
          ("max_seqlen_q", 2.5, TypeError, "max_seqlen_q", "float"),
          ("max_seqlen_k", 3, ValueError, "max_seqlen_k", "below-longest"),
          ("check_seqlens", "yes", TypeError, "check_seqlens", "str")),
    *score_option_rows(VARLEN),
    *rows(NO_KEYS,
          ("k", with_("k", lambda k: k.float()), ValueError, "k", "dtype-mismatch"),
          ("k", with_("k", META), ValueError, "k", "meta-device"),
          ("k", lambda kw: T(0, 2, 4), ValueError, "k", "head-dim"),
          ("k", lambda kw: T(0, 3, 8), ValueError, "k", "heads-not-dividing"),
          ("v", lambda kw: T(5, 2, 8), ValueError, "v", "rows-not-k's"),
          ("v", lambda kw: T(0, 1, 8), ValueError, "v", "heads"),
          ("v", lambda kw: T(0, 2, 300), ValueError, "v", "head-dim-300"),
          ("v", lambda kw: T(0, 2, 8, 1), ValueError, "v", "rank-4")),
    *[c for target in SOFTMAXES for c in rows(
        target,
        ("x", [1.0, 2.0], TypeError, "x", "list"),
        ("x", lambda kw: torch.arange(6, device=DEVICE).reshape(2, 3), TypeError, "x", "int64"),
        ("x", with_("x", lambda x: x.double()), TypeError, "x", "float64"),
        ("dim", 2, IndexError, "dim", "out-of-range"),
        ("dim", -3, IndexError, "dim", "negative-out-of-range"),
        ("dim", 1.0, TypeError, "dim", "float"),
        ("dim", "1", TypeError, "dim", "str"),
        ("dtype", torch.int32, TypeError, "dtype", "int32"),
        ("dtype", "float32", TypeError, "dtype", "str"))],
    *rows(SOFTMAXES[2],
          ("dim", (), ValueError, "dim", "empty-tuple"),
          ("dim", (0, -2), ValueError, "dim", "repeated"),
          ("keepdim", "yes", TypeError, "keepdim", "str")),
    *rows(MERGE,
          ("o_a", lambda kw: kw["o_a"].tolist(), TypeError, "o_a", "list"),
          ("o_a", with_("o_a", lambda t: t[0]), ValueError, "o_a", "rank-3"),
          ("o_a", with_("o_a", lambda t: t[..., :0]), ValueError, "o_a", "empty"),
          ("lse_a", with_("lse_a", lambda t: t.half()), TypeError, "lse_a", "fp16"),
          ("lse_a", with_("lse_a", lambda t: t[:, :, :2]), ValueError, "lse_a", "shape"),
          ("o_b", with_("o_b", lambda t: t[:, :1]), ValueError, "o_b", "shape"),
          ("o_b", with_("o_b", lambda t: t.float()), ValueError, "o_b", "dtype-mismatch"),
          ("lse_b", with_("lse_b", META), ValueError, "lse_b", "meta-device"),
          ("o_b", with_("o_b", META), ValueError, "o_b", "meta-device")),
    *rows(STACKED,
          ("o", with_("o", lambda t: t[0]), ValueError, "o", "rank-4"),
          ("o", [], ValueError, "o", "empty-list"),
          ("o", lambda kw: [T(1, 2, 3, 8), T(1, 2, 4, 8)], ValueError, "o", "list-shapes-differ"),
          ("o", lambda kw: [T(1, 2, 3, 8), T(1, 2, 3, 8), T(1, 2, 3, 8).float()], ValueError, "o",
           "list-dtypes-differ"),
          ("o", lambda kw: [T(1, 2, 3, 8), T(1, 2, 3, 8), META(T(1, 2, 3, 8))], ValueError, "o",
           "list-devices-differ"),
          ("lse", with_("lse", lambda t: t[:, :, :, :2]), ValueError, "lse", "shape"),
          ("lse", with_("lse", lambda t: t.half()), TypeError, "lse", "fp16"),
          ("lse", lambda kw: [T(1, 2, 3, dtype=torch.float32)] * 2, ValueError, "lse", "list-length"),
          ("lse", with_("lse", META), ValueError, "lse", "meta-device")),
    *rows(DECODE,
          ("q", with_("q", lambda t: t.to(torch.int32)), TypeError, "q", "int32"),
          ("q", with_("q", lambda t: t[0]), ValueError, "q", "rank-3"),
          ("q", with_("q", lambda t: t[:, :, :0]), ValueError, "q", "empty"),
          ("k_cache", with_("k_cache", META), ValueError, "k_cache", "meta-device"),
          ("k_cache", with_("k_cache", lambda t: t.float()), ValueError, "k_cache", "dtype-mismatch"),
          ("k_cache", with_("k_cache", lambda t: t[:1]), ValueError, "k_cache", "batch"),
          ("v_cache", with_("v_cache", lambda t: t[:, :, :5]), ValueError, "v_cache", "length"),
          ("v_cache", lambda kw: T(2, 2, 10, 257), ValueError, "v_cache", "head-dim-257"),
          ("cache_seqlens", with_("cache_seqlens", lambda t: t.long()), TypeError, "cache_seqlens", "int64"),
          ("cache_seqlens", with_("cache_seqlens", lambda t: t.float()), TypeError, "cache_seqlens", "float"),
          ("cache_seqlens", with_("cache_seqlens", META), ValueError, "cache_seqlens", "meta-device"),
          ("cache_seqlens", lambda kw: I32([3]), ValueError, "cache_seqlens", "batch"),
          ("cache_seqlens", lambda kw: I32([3, 11]), ValueError, "cache_seqlens", "above-capacity"),
          ("cache_seqlens", lambda kw: I32([-1, 3]), ValueError, "cache_seqlens", "negative"),
          ("cache_seqlens", [3, 10], TypeError, "cache_seqlens", "list"),
          ("num_splits", 0, ValueError, "num_splits", "zero"),
          ("num_splits", 1.5, ValueError, "num_splits", "float"),
          ("num_splits", True, ValueError, "num_splits", "bool"),
          ("scale", float("nan"), ValueError, "scale", "nan"),
          ("return_lse", "yes", TypeError, "return_lse", "str"),
          ("check_values", "yes", TypeError, "check_values", "str")),
    *rows(PAGED,
          ("block_table", with_("block_table", lambda t: t.long()), TypeError, "block_table", "int64"),
          ("block_table", with_("block_table", lambda t: t[0]), ValueError, "block_table", "rank-1"),
          ("block_table", with_("block_table", lambda t: t[:1]), ValueError, "block_table", "batch"),
          ("block_table", with_("block_table", lambda t: t[:, :0]), ValueError, "block_table", "no-columns"),
          ("block_table", with_("block_table", META), ValueError, "block_table", "meta-device"),
          ("block_table", lambda kw: I32([[4, -1], [0, 5]]), ValueError, "block_table", "id-out-of-range"),
          ("block_table", lambda kw: I32([[-1, -1], [0, 2]]), ValueError, "block_table", "negative-id-in-use"),
          ("cache_seqlens", lambda kw: I32([3, 9]), ValueError, "cache_seqlens", "above-table-capacity")),
    *rows(SDPA,
          ("query", lambda kw: kw["query"].tolist(), TypeError, "query", "list"),
          ("key", with_("key", lambda t: t[..., :4]), RuntimeError, "key", "head-dim"),
          ("key", with_("key", lambda t: t.float()), RuntimeError, "key", "dtype-mismatch"),
          ("key", with_("key", META), RuntimeError, "key", "meta-device"),
          ("value", with_("value", lambda t: t[:, :, :3]), RuntimeError, "value", "length"),
          ("key", lambda kw: T(1, 3, 7, 8), RuntimeError, "key", "gqa-heads"),
          ("attn_mask", [[True]], TypeError, "attn_mask", "list"),
          ("attn_mask", lambda kw: torch.ones(5, 7, dtype=torch.int32, device=DEVICE), RuntimeError, "attn_mask",
           "int32"),
          ("attn_mask", lambda kw: torch.ones(5, 6, dtype=torch.bool, device=DEVICE), RuntimeError, "attn_mask",
           "shape"),
          ("attn_mask", lambda kw: torch.ones(5, 7, dtype=torch.bool, device="meta"), RuntimeError, "attn_mask",
           "meta-device"),
          ("dropout_p", 1.5, RuntimeError, "dropout_p", "above-1"),
          ("dropout_p", -0.1, RuntimeError, "dropout_p", "negative"),
          ("dropout_p", "0.1", RuntimeError, "dropout_p", "str"),
          ("scale", float("nan"), ValueError, "scale", "nan"),
          ("is_causal", "yes", TypeError, "is_causal", "str"),
          ("is_causal", 1, TypeError, "is_causal", "int"),
          ("enable_gqa", "yes", TypeError, "enable_gqa", "str")),
    Case("scaled_dot_product_attention", fl.scaled_dot_product_attention,
         lambda: dict(attn_mask=torch.ones(5, 7, dtype=torch.bool, device=DEVICE), **sdpa_base()),
         "is_causal", True, RuntimeError, "is_causal|attn_mask", "with-mask"),
    Case("replace_sdpa", fl.replace_sdpa, dict, "model", "gpt2", TypeError, "model", "str"),
    *rows(MODULE,
          ("attn_mask", lambda kw: torch.ones(5, 6, dtype=torch.bool, device=DEVICE), ValueError, "attn_mask",
           "shape"),
          ("attn_mask", lambda kw: torch.ones(5, 7, dtype=torch.int32, device=DEVICE), TypeError, "attn_mask",
           "int32"),
          ("attn_mask", lambda kw: torch.ones(5, 7, device="meta"), ValueError, "attn_mask", "meta-device"),
          ("attn_mask", lambda kw: torch.zeros(5, 7, device=DEVICE, requires_grad=True), ValueError, "attn_mask",
           "requires-grad"),
          ("attn_mask", [[True]], TypeError, "attn_mask", "list")),
    Case("FlashAttention", fl.nn.FlashAttention, dict, "dropout", 1.5, ValueError, "dropout", "above-1"),
    Case("FlashAttention", fl.nn.FlashAttention, dict, "dropout", -0.5, ValueError, "dropout", "negative"),
    Case("FlashAttention", fl.nn.FlashAttention, dict, "causal", "yes", TypeError, "causal", "str"),
    Case("FlashAttention", fl.nn.FlashAttention, dict, "scale", float("nan"), ValueError, "scale", "nan"),
    Case("FlashAttention", fl.nn.FlashAttention, dict, "scale", "big", TypeError, "scale", "str"),
    *rows(MHA,
          ("num_heads", 0, ValueError, "num_heads", "zero"),
          ("num_kv_heads", 3, ValueError, "num_kv_heads", "not-dividing"),
          ("embed_dim", 18, ValueError, "embed_dim", "not-divisible"),
          ("embed_dim", -16, ValueError, "embed_dim", "negative"),
          ("embed_dim", 16.0, TypeError, "embed_dim", "float"),
          ("num_kv_heads", 0, ValueError, "num_kv_heads", "zero"),
          ("dropout", 2.0, ValueError, "dropout", "above-1"),
          ("head_dim", 0, ValueError, "head_dim", "zero"),
          ("head_dim", 300, ValueError, "head_dim", "above-256"),
          ("head_dim", 8.0, TypeError, "head_dim", "float"),
          ("embed_dim", 1040, ValueError, "head_dim", "derived-head-dim-above-256"),
          ("causal", "yes", TypeError, "causal", "str"),
          ("rotary", "yes", TypeError, "rotary", "str"),
          ("fused_qkv", 0, TypeError, "fused_qkv", "int"),
          ("bias", None, TypeError, "bias", "none")),
    Case("MultiheadAttention", mha_new, lambda: dict(mha_base(), head_dim=5), "rotary", True, ValueError,
         "head dim|head_dim", "odd-head-dim"),
    *rows(MHA_FWD,
          ("x", lambda kw: T(5, 16, dtype=torch.float32), ValueError, "x", "rank-2"),
          ("x", lambda kw: T(2, 5, 12, dtype=torch.float32), ValueError, "x", "width"),
          ("context", lambda kw: T(2, 6, 12, dtype=torch.float32), ValueError, "context", "width"),
          ("context", lambda kw: T(3, 6, 16, dtype=torch.float32), ValueError, "context", "batch"),
          ("context", lambda kw: T(2, 6, 16, dtype=torch.float32)[0], ValueError, "context", "rank-2"),
          ("positions", lambda kw: torch.arange(4, device=DEVICE), ValueError, "positions", "length"),
          ("positions", lambda kw: torch.arange(5, device=DEVICE).expand(3, 5), ValueError, "positions", "batch"),
          ("positions", lambda kw: torch.arange(5, device="meta"), ValueError, "positions", "meta-device"),
          ("attn_mask", lambda kw: torch.ones(5, 6, dtype=torch.bool, device=DEVICE), ValueError, "attn_mask",
           "shape")),
]


def _exists(case: Case) -> bool:
    if case.call is None:
        return False
    try:
        params = inspect.signature(case.call).parameters
    except (TypeError, ValueError):
        return True
    return case.arg in params or any(p.kind == p.VAR_KEYWORD for p in params.values())


@contextmanager
def deadline(seconds: int, what: str):
    """Fail instead of hanging (SIGALRM: the main thread of a Unix process, which pytest is)."""
    def boom(*_):
        raise TimeoutError(f"{what} did not return within {seconds} s")
    old = signal.signal(signal.SIGALRM, boom)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def names_argument(message: str, name: str) -> bool:
    """The message names ``name`` as a word (``k`` in "q, k, v must share…", not in "keys")."""
    return re.search(rf"(?<![A-Za-z0-9_])(?:{name})(?![A-Za-z0-9_])", message) is not None


# Rows that fail today (another exception, a message without the name, or the value accepted):
# the findings listed in docs/trust.md. strict: once fixed, the row passes and its entry must go.
KNOWN: dict[str, str] = {}


def _param(case: Case):
    marks = [pytest.mark.xfail(strict=True, reason=KNOWN[case.id])] if case.id in KNOWN else []
    return pytest.param(case, id=case.id, marks=marks)


@pytest.mark.parametrize("case", [_param(c) for c in CASES])
def test_bad_argument_is_rejected_by_name(case):
    if not _exists(case):
        pytest.skip(f"{case.fn} has no argument {case.arg!r} yet")
    kwargs = case.base()
    kwargs[case.arg] = case.bad(kwargs) if callable(case.bad) and not isinstance(case.bad, type) else case.bad
    with deadline(120, case.id):
        with pytest.raises(Exception) as info:
            case.call(**kwargs)
    err = info.value
    assert isinstance(err, case.exc), f"{case.id}: raised {type(err).__name__}: {err}"
    assert names_argument(str(err), case.name), f"{case.id}: message does not name {case.name!r}: {err}"


@pytest.mark.parametrize("base", sorted({(c.fn, c.base) for c in CASES if c.call is not None},
                                        key=lambda fb: fb[0]), ids=lambda fb: fb[0])
def test_base_calls_are_valid(base):
    """Each row's starting point runs: the errors above come from the one argument changed."""
    fn, make = base
    call = next(c.call for c in CASES if c.fn == fn and c.base is make)
    with deadline(120, fn):
        result = call(**make())
    if hasattr(result, "restore"):  # replace_sdpa's handle: put torch's function back
        result.restore()


# ------------------------------------------------------------------ the CLI

def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _typed_options():
    """(subcommand, option, bad value) for every option argparse itself converts (type= or choices=):
    a value that cannot convert must stop the command before it runs."""
    out = []
    for name, p in _subcommands().items():
        for a in p._actions:
            if not a.option_strings or a.nargs == 0 or a.help == argparse.SUPPRESS:
                continue
            if a.choices is not None or a.type not in (None, str):
                out.append((name, a.option_strings[-1], "not-a-value"))
    return out


# Values that convert but are out of range: run()'s checks must reject them before measuring.
# Every command also gets ``--time-budget 0`` (start no point) so that an accepted value returns
# at once instead of benchmarking.
RANGE_CASES = [
    ("memory", "--batch", "0"), ("memory", "--heads", "-2"), ("memory", "--head-dim", "300"),
    ("memory", "--gqa", "0"), ("memory", "--max-point-seconds", "-1"), ("memory", "--min-n", "0"),
    ("memory", "--max-point-seconds", "nan"), ("memory", "--time-budget", "-5"),
    ("speed", "--head-dims", "0"), ("speed", "--rep-ms", "0"), ("speed", "--gqa", "0"), ("speed", "--hidden", "0"),
    ("speed", "--tokens", "-1"), ("speed", "--lengths", "0"),
    ("softmax", "--min-log2n", "40"), ("softmax", "--max-log2n", "-1"), ("softmax", "--log2n", "10,40"),
    ("softmax", "--log2n", "ten"), ("softmax", "--total-mib", "0"), ("softmax", "--dtypes", "int8"),
    ("softmax", "--directions", "up"),
    ("decode", "--batch", "0"), ("decode", "--heads", "0"), ("decode", "--kv-heads", "3"),
    ("decode", "--head-dim", "0"), ("decode", "--block-sizes", "0"), ("decode", "--mem-fraction", "2"),
    ("decode", "--lengths", "0"),
]


def _run_bad(argv, capsys, tmp_path):
    extra = [] if "--time-budget" in argv or argv[0] not in cli._COMMANDS and argv[0] != "all" else \
        ["--time-budget", "0"]
    out = ["--out", str(tmp_path)] if argv[0] in cli._COMMANDS or argv[0] == "all" else []
    with deadline(120, " ".join(argv)):
        return run_cli(argv + extra + out, capsys)


KNOWN_CLI: dict = {}


@pytest.mark.parametrize("command,option,value", [
    pytest.param(*c, id=" ".join(c), marks=[pytest.mark.xfail(strict=True, reason=KNOWN_CLI[c])] if c in KNOWN_CLI
                 else []) for c in _typed_options() + RANGE_CASES])
def test_cli_bad_option_is_a_usage_error(command, option, value, capsys, tmp_path):
    if (command, option, value) in RANGE_CASES and option not in _option_names(command):
        pytest.skip(f"{command} has no {option}")
    status, _, err = _run_bad([command, option, value], capsys, tmp_path)
    assert status == 2, f"{command} {option} {value}: exit status {status}, stderr: {err[-300:]}"
    assert option in err or option.lstrip("-") in err, f"stderr does not name {option}: {err[-300:]}"
    assert "Traceback" not in err


def _option_names(command: str) -> set[str]:
    return {s for a in _subcommands()[command]._actions for s in a.option_strings}


def test_cli_unknown_subcommand_and_option(capsys, tmp_path):
    for argv in (["bogus"], ["memory", "--no-such-option"]):
        status, _, err = _run_bad(argv, capsys, tmp_path)
        assert status == 2 and ("bogus" in err or "--no-such-option" in err)


@pytest.mark.parametrize("floor", [0.0, -1e-3, float("inf"), float("nan"), "1e-3", True])
def test_rel_err_floor_must_be_a_positive_number(floor):
    from flashattn_lite.reference import rel_err
    x = torch.ones(3)
    with pytest.raises(ValueError, match="floor_rms"):
        rel_err(x, x, floor)
    assert rel_err(x, x, 1e-3) == 0.0


@pytest.mark.parametrize("name, read", [
    ("FLASHATTN_LITE_LOG", lambda: __import__("flashattn_lite._log", fromlist=["x"]).log_enabled()),
    ("FLASHATTN_LITE_AUTOTUNE", lambda: __import__("flashattn_lite.configs.tuning", fromlist=["x"]).autotune_requested()),
    ("FLASHATTN_LITE_HOPPER", lambda: __import__("flashattn_lite.ops.attention_fwd_hopper", fromlist=["x"]).enabled()),
    ("FLASHATTN_LITE_FAST_LAUNCH", lambda: __import__("flashattn_lite._launcher", fromlist=["x"]).fast_launch_enabled()),
])
@pytest.mark.parametrize("value", ["true", "off", "yes", "2"])
def test_on_off_settings_refuse_values_they_do_not_know(monkeypatch, name, read, value):
    """``true`` meant off for AUTOTUNE and ``off`` meant on for LOG: a value neither 0 nor 1 names the
    variable instead of passing as one or the other."""
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=f"{name} must be 0 or 1, got '{value}'"):
        read()
    monkeypatch.setenv(name, " 1 ")
    read()  # surrounding blanks are fine
