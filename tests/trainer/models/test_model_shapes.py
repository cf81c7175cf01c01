"""Presets, parameter counts, FLOPs, and the model interface the training loop relies on."""

import pytest
import torch
from torch import nn

from trainer.models import (
    PRESETS,
    PUBLISHED_PARAMS,
    ModelConfig,
    build_model,
    flops_per_token,
    get_preset,
    num_params,
)

torch.set_num_threads(1)
TINY = ["pythia-tiny", "llama-tiny"]


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMS))
def test_preset_param_count_matches_published(name):
    published = PUBLISHED_PARAMS[name]
    assert abs(num_params(PRESETS[name]) - published) / published < 0.01


@pytest.mark.parametrize("name", ["pythia-70m", "pythia-410m", "pythia-1b", "pythia-6.9b"])
def test_pythia_param_counts_are_exact(name):
    # Pythia publishes exact totals; the analytic count reproduces them to the parameter.
    assert num_params(PRESETS[name]) == PUBLISHED_PARAMS[name]


@pytest.mark.parametrize("name", TINY)
@pytest.mark.parametrize("tie", [False, True])
def test_analytic_count_equals_built_model(name, tie):
    cfg = get_preset(name, tie_embeddings=tie)
    model = build_model(cfg)
    assert sum(p.numel() for p in model.parameters()) == num_params(cfg)


def test_big_preset_counts_equal_a_meta_built_model():
    # Built on the meta device: shapes only, no memory.
    for name in ["pythia-1b", "llama-3-8b"]:
        with torch.device("meta"):
            model = build_model(PRESETS[name])
        assert sum(p.numel() for p in model.parameters()) == num_params(PRESETS[name])


@pytest.mark.parametrize("name", TINY)
def test_forward_contract(name):
    cfg = get_preset(name)
    model = build_model(cfg)
    assert isinstance(model.layers, nn.ModuleList) and len(model.layers) == cfg.num_layers
    ids = torch.randint(0, cfg.vocab_size, (3, 19))
    logits = model(ids)
    assert logits.shape == (3, 19, cfg.vocab_size) and logits.dtype == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert model(ids).dtype == torch.float32
    with pytest.raises(ValueError):
        model(torch.zeros(1, cfg.max_seq_len + 1, dtype=torch.long))


@pytest.mark.parametrize("name", TINY)
def test_causal(name):
    # Changing a later token must not change earlier logits.
    cfg = get_preset(name)
    model = build_model(cfg).eval()
    ids = torch.randint(0, cfg.vocab_size, (1, 16))
    changed = ids.clone()
    changed[0, 10] = (changed[0, 10] + 1) % cfg.vocab_size
    with torch.no_grad():
        a, b = model(ids), model(changed)
    torch.testing.assert_close(a[:, :10], b[:, :10])
    assert not torch.allclose(a[:, 10:], b[:, 10:])


@pytest.mark.parametrize("name", TINY)
def test_init_weights_is_deterministic_and_leaves_rng_alone(name):
    cfg = get_preset(name)
    a, b = build_model(cfg), build_model(cfg)
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    a.init_weights(seed=7)
    b.init_weights(seed=7)
    assert torch.equal(torch.random.get_rng_state(), before)
    for (ka, va), (kb, vb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert ka == kb and torch.equal(va, vb), ka
    b.init_weights(seed=8)
    assert not torch.equal(a.embed.weight, b.embed.weight)


def test_meta_build_then_materialise_equals_eager_build():
    cfg = get_preset("llama-tiny")
    with torch.device("meta"):
        lazy = build_model(cfg)
    lazy.to_empty(device="cpu")
    lazy.init_weights(seed=1)
    eager = build_model(cfg)
    eager.init_weights(seed=1)
    ids = torch.randint(0, cfg.vocab_size, (2, 8))
    torch.testing.assert_close(lazy(ids), eager(ids), rtol=0, atol=0)


def test_flops_per_token_formula():
    cfg = PRESETS["pythia-410m"]
    n_matmul = num_params(cfg) - cfg.vocab_size * cfg.hidden_size  # input embedding is a lookup
    assert flops_per_token(cfg, 2048) == 6 * n_matmul + 12 * cfg.num_layers * cfg.hidden_size * 2048
    tied = get_preset("llama-tiny", tie_embeddings=True)
    assert flops_per_token(tied, 1) == 6 * num_params(tied) + 12 * tied.num_layers * tied.hidden_size


def test_config_round_trip_and_validation():
    cfg = get_preset("llama-tiny", vocab_size=1000)
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError):
        ModelConfig.from_dict({**cfg.to_dict(), "hidden": 3})
    with pytest.raises(ValueError):
        get_preset("llama-tiny", num_kv_heads=3)
    with pytest.raises(KeyError):
        get_preset("gpt-5")


def test_gradients_reach_every_parameter():
    for name in TINY:
        model = build_model(get_preset(name))
        ids = torch.randint(0, 512, (2, 12))
        torch.nn.functional.cross_entropy(model(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten()).backward()
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
