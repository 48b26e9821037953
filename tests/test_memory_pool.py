"""The kernels' output tensors come from squant's pool of freed blocks: a block freed by one
call serves the next call of the same size, and a live tensor's block is never handed out."""

import pickle

import torch

from squant import kernels


def quantize(x: torch.Tensor) -> torch.Tensor:
    return torch.ops.squant.quantize_per_token(x)[0]


def test_a_freed_output_block_serves_the_next_call():
    kernels.load()
    x = torch.randn(64, 1000)
    first = quantize(x)
    address = first.data_ptr()
    expected = first.clone()
    size = first.numel()
    del first
    # malloc would hand the freed block to this tensor; the pool keeps it for squant's kernels
    decoy = torch.empty(size, dtype=torch.uint8)
    again = quantize(x)
    assert again.data_ptr() == address != decoy.data_ptr()
    assert torch.equal(again, expected)


def test_live_outputs_never_share_a_block():
    kernels.load()
    x = torch.randn(64, 1000)
    outs = [quantize(x * (i + 1)) for i in range(4)]
    assert len({o.data_ptr() for o in outs}) == 4
    for i, o in enumerate(outs):
        assert torch.equal(o, quantize(x * (i + 1)))
    assert all(o.data_ptr() % 64 == 0 for o in outs)


def test_pooled_outputs_behave_as_tensors():
    kernels.load()
    out = quantize(torch.randn(8, 300))
    copy = pickle.loads(pickle.dumps(out))
    assert torch.equal(copy, out)
    out.resize_(16, 300)  # storage grows through the pool's allocator
    assert out.shape == (16, 300)
