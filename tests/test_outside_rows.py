"""clear_outside_rows: the rows of a packed batch before its first bound or past its last one are
set, every other row is left as it was, whatever the bounds (clamped into the rows), the strides
and the number of bounds."""
import pytest
import torch

from conftest import DEVICE
from flashattn_lite.ops.outside_rows import clear_outside_rows


def _outside(bounds, total):
    """The rows the bounds leave out, read as the kernels read them: clamped into [0, total]."""
    first = min(max(bounds[0], 0), total)
    last = min(max(max(bounds), first), total)
    rows = torch.ones(total, dtype=torch.bool)
    rows[first:last] = False
    return rows


@pytest.mark.parametrize("bounds", [[0, 5, 9], [3, 8, 70], [-4, 30, 60], [5, 200], [40, 0, 0], [0, 70],
                                    [0] + list(range(1, 300)) + [0]],  # 301 bounds: several scan steps
                         ids=["short-tail", "late-start", "below-0", "past-total", "zero-padded", "covering", "300-sequences"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
def test_clears_exactly_the_rows_outside(bounds, dtype):
    total = 70 if len(bounds) < 10 else 301  # not a multiple of the 64-row blocks
    g = torch.Generator().manual_seed(0)
    # o as a strided view (total, H, D) of (H, total, D) storage; lse (H, total) with a padded row stride.
    o = (torch.randn(3, total, 20, generator=g) + 5).to(DEVICE, dtype).transpose(0, 1)
    lse = (torch.randn(3, total + 7, generator=g) + 5).to(DEVICE)[:, :total]
    o0, lse0 = o.clone(), lse.clone()
    clear_outside_rows(torch.tensor(bounds, dtype=torch.int32, device=DEVICE), o, 0.0, lse, float("-inf"),
                       b_rows_dim=1)
    out = _outside(bounds, total).to(DEVICE)
    assert out.any() or bounds == [0, 70]
    assert not o[out].any() and bool((lse[:, out] == float("-inf")).all())
    assert torch.equal(o[~out], o0[~out]) and torch.equal(lse[:, ~out], lse0[:, ~out])


def test_two_tensors_of_one_side_and_repeated_calls():
    """dk and dv (different head dims) share their bounds: one launch clears both. A second call of
    the same signature with new tensors and new bounds (on a GPU: the bound launch) clears those."""
    for lo, hi in ((10, 30), (0, 45)):
        dk, dv = torch.ones(50, 2, 8, device=DEVICE), torch.ones(50, 2, 24, device=DEVICE)
        clear_outside_rows(torch.tensor([lo, 20, hi], dtype=torch.int32, device=DEVICE), dk, 0.0, dv)
        for t in (dk, dv):
            assert not t[:lo].any() and not t[hi:].any() and bool((t[lo:hi] == 1).all())
