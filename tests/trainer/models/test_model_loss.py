"""The chunked output-projection + cross-entropy equals the plain path, in value and gradients."""

import pytest
import torch
import torch.nn.functional as F

from trainer.models import build_model, get_preset
from trainer.models.loss import linear_cross_entropy

torch.set_num_threads(1)


def _plain(hidden, weight, labels):
    return F.cross_entropy(F.linear(hidden, weight).float(), labels, ignore_index=-100)


@pytest.mark.parametrize("chunk", [7, 64, 1000])
@pytest.mark.parametrize("ignore", [False, True])
def test_matches_plain_cross_entropy(chunk, ignore):
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(100, 32, generator=gen, requires_grad=True)
    weight = torch.randn(300, 32, generator=gen, requires_grad=True)
    labels = torch.randint(0, 300, (100,), generator=gen)
    if ignore:
        labels[::3] = -100
    expected = _plain(hidden, weight, labels)
    grads = torch.autograd.grad(expected * 2.5, (hidden, weight))
    got = linear_cross_entropy(hidden, weight, labels, chunk_size=chunk)
    got_grads = torch.autograd.grad(got * 2.5, (hidden, weight))
    torch.testing.assert_close(got, expected)
    for g, e in zip(got_grads, grads):
        torch.testing.assert_close(g, e)


@pytest.mark.parametrize("name", ["pythia-tiny", "llama-tiny", "llama-tiny-tied"])
def test_model_forward_with_labels_matches_logits_path(name):
    cfg = get_preset(name.removesuffix("-tied"), tie_embeddings=name.endswith("-tied"))
    model = build_model(cfg)
    tokens = torch.randint(0, cfg.vocab_size, (2, 33))
    inputs, labels = tokens[:, :-1], tokens[:, 1:]
    plain = F.cross_entropy(model(inputs).flatten(0, 1), labels.flatten())
    plain_grads = torch.autograd.grad(plain, list(model.parameters()))
    fused = model(inputs, labels=labels)
    fused_grads = torch.autograd.grad(fused, list(model.parameters()))
    torch.testing.assert_close(fused, plain)
    for g, e in zip(fused_grads, plain_grads):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-6)


def test_bf16_autocast_runs_matmuls_in_bf16_and_keeps_param_dtypes():
    cfg = get_preset("llama-tiny")
    model = build_model(cfg)
    tokens = torch.randint(0, cfg.vocab_size, (2, 17))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fused = model(tokens[:, :-1], labels=tokens[:, 1:])
        plain = F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
    assert fused.dtype == torch.float32
    torch.testing.assert_close(fused, plain, rtol=2e-2, atol=2e-2)
    fused.backward()
    assert all(p.grad.dtype == torch.float32 for p in model.parameters())


def test_without_grad_only_the_loss_is_computed_and_it_is_the_same():
    gen = torch.Generator().manual_seed(1)
    hidden = torch.randn(50, 16, generator=gen, requires_grad=True)
    weight = torch.randn(70, 16, generator=gen, requires_grad=True)
    labels = torch.randint(0, 70, (50,), generator=gen)
    labels[::4] = -100
    with_grad = linear_cross_entropy(hidden, weight, labels, chunk_size=16)
    with torch.no_grad():
        without = linear_cross_entropy(hidden, weight, labels, chunk_size=16)
    assert not without.requires_grad
    torch.testing.assert_close(without, with_grad.detach(), rtol=0, atol=0)
    torch.testing.assert_close(without, _plain(hidden, weight, labels).detach())


def test_default_chunk_size_bounds_the_logits_of_a_chunk():
    from trainer.models.loss import CHUNK_ELEMENTS, default_chunk_size

    assert default_chunk_size(2048, 8192) * 8192 <= CHUNK_ELEMENTS
    assert default_chunk_size(100, 8192) == 100  # never more than the tokens there are
    assert default_chunk_size(8192, 128256) == 65  # big vocabularies: small chunks, but not tiny
