"""RoPE: the sign-folded, roll-based form is bit for bit Hugging Face's rotate-half form."""

import pytest
import torch

from trainer.models.rope import apply_rope, rope_tables, signed_sin


def _hf_rope(x, cos, sin):
    """transformers' apply_rotary_pos_emb for one tensor [B, T, heads, D] (partial rotary too)."""
    rotary_dim = cos.shape[-1]
    cos, sin = cos[:, None], sin[:, None]
    x_rot, x_pass = x[..., :rotary_dim], x[..., rotary_dim:]
    x1, x2 = x_rot.chunk(2, dim=-1)
    rotated = torch.cat((-x2, x1), dim=-1)
    return torch.cat((x_rot * cos + rotated * sin, x_pass), dim=-1)


@pytest.mark.parametrize("rotary_dim,head_dim", [(16, 64), (64, 64), (8, 32)])
def test_apply_rope_is_bitwise_hugging_face(rotary_dim, head_dim):
    cos, sin = rope_tables(rotary_dim, 40, 10000.0)
    x = torch.randn(2, 40, 3, head_dim, generator=torch.Generator().manual_seed(0))
    expected = _hf_rope(x, cos, sin)
    assert torch.equal(apply_rope(x, cos, signed_sin(sin)), expected)
    assert torch.equal(apply_rope(x, cos[:, None], signed_sin(sin)[:, None]), expected)


def test_apply_rope_gradient_matches_hugging_face():
    cos, sin = rope_tables(16, 24, 10000.0)
    x = torch.randn(2, 24, 3, 64, requires_grad=True)
    grad = torch.randn(2, 24, 3, 64)
    (expected,) = torch.autograd.grad(_hf_rope(x, cos, sin), x, grad)
    (got,) = torch.autograd.grad(apply_rope(x, cos, signed_sin(sin)), x, grad)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
