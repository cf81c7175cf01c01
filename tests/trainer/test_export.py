"""Acceptance 1: Hugging Face export/import parity for tiny GPT-NeoX and LLaMA (GQA) models.

The reference is `transformers`' own eager attention (plain matmul + softmax), an implementation
independent of the SDPA path our models take.
"""

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402

from trainer.export import export_hf, import_hf, to_hf_config  # noqa: E402
from trainer.models import build_model, get_preset  # noqa: E402

torch.set_num_threads(1)
ATOL = 1e-4

CONFIGS = {
    "neox-parallel": get_preset("pythia-tiny"),
    "neox-sequential-tied": get_preset("pythia-tiny", use_parallel_residual=False, tie_embeddings=True),
    "llama-gqa": get_preset("llama-tiny", rope_theta=500000.0),
    "llama-gqa-tied": get_preset("llama-tiny", tie_embeddings=True),
}


def _random_model(cfg, seed=0):
    """A model whose logits are O(1) and whose norms and biases are not at identity, so that any
    wrong layout, transpose or missing term shows up far above the tolerance."""
    model = build_model(cfg.replace(init_std=0.1))
    model.init_weights(seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(0.2 * torch.randn(p.shape, generator=gen))
    return model.eval()


def _hf_load(path):
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        path, attn_implementation="eager", dtype=torch.float32, output_loading_info=True
    )
    assert not any(info.get(k) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    return model.eval()


def _ids(cfg, seed=0, batch=2, seq=40):
    return torch.randint(0, cfg.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_exported_model_matches_transformers(name, tmp_path):
    cfg = CONFIGS[name]
    ours = _random_model(cfg)
    export_hf(ours.state_dict(), ours.cfg, tmp_path)
    hf = _hf_load(tmp_path)
    assert type(hf).__name__ == ("GPTNeoXForCausalLM" if cfg.family == "gpt_neox" else "LlamaForCausalLM")
    ids = _ids(cfg)
    with torch.no_grad():
        ours_logits, hf_logits = ours(ids), hf(ids).logits
    assert ours_logits.std() > 0.3  # the comparison is not between near-zero numbers
    torch.testing.assert_close(ours_logits, hf_logits, rtol=0, atol=ATOL)


def _hf_random(cfg, path, seed=0):
    """A randomly initialised transformers model for `cfg`, saved with save_pretrained."""
    hf_cfg = to_hf_config(cfg)
    hf_cfg.pop("architectures")
    config = transformers.AutoConfig.for_model(**hf_cfg)
    config.initializer_range = 0.1
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(0.2 * torch.randn_like(p))
    model.save_pretrained(path)
    return model


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_imported_hf_checkpoint_matches(name, tmp_path):
    cfg = CONFIGS[name]
    hf = _hf_random(cfg, tmp_path)
    imported_cfg, state_dict = import_hf(tmp_path)
    assert imported_cfg.replace(init_std=cfg.init_std) == cfg
    ours = build_model(imported_cfg)
    ours.load_state_dict(state_dict, strict=True)
    ids = _ids(cfg, seed=1)
    with torch.no_grad():
        torch.testing.assert_close(ours.eval()(ids), hf(ids).logits, rtol=0, atol=ATOL)


@pytest.mark.parametrize("name", ["neox-parallel", "llama-gqa"])
def test_export_import_round_trip_is_exact(name, tmp_path):
    model = _random_model(CONFIGS[name])
    export_hf(model.state_dict(), model.cfg, tmp_path)
    cfg, state_dict = import_hf(tmp_path)
    assert cfg == model.cfg
    original = model.state_dict()
    assert state_dict.keys() == original.keys()
    for key, value in original.items():
        assert torch.equal(state_dict[key], value), key


def test_bf16_export_loads_in_bf16(tmp_path):
    model = _random_model(CONFIGS["llama-gqa"])
    export_hf(model.state_dict(), model.cfg, tmp_path, dtype=torch.bfloat16)
    assert json.loads((tmp_path / "config.json").read_text())["torch_dtype"] == "bfloat16"
    _, state_dict = import_hf(tmp_path)
    assert all(t.dtype == torch.bfloat16 for t in state_dict.values())


def test_export_copies_tokenizer_for_autotokenizer(tmp_path):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        ["def f(x):\n    return x + 1\n"] * 20 + ["import os, sys; print(os.getcwd())"] * 20,
        trainers.BpeTrainer(
            vocab_size=300,
            special_tokens=["<|endoftext|>", "<|padding|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    tok.save(str(tmp_path / "tokenizer.json"))
    cfg = get_preset("pythia-tiny", vocab_size=tok.get_vocab_size())
    out = tmp_path / "hf"
    export_hf(build_model(cfg).state_dict(), cfg, out, tokenizer_path=tmp_path)
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= {
        p.name for p in out.iterdir()
    }
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    text = "def g(y):\n    return os.sys"
    assert hf_tok(text)["input_ids"] == tok.encode(text).ids
    assert hf_tok.eos_token == "<|endoftext|>" and hf_tok.eos_token_id == 0
    assert json.loads((out / "config.json").read_text())["eos_token_id"] == 0


def test_unsupported_hf_variants_are_refused(tmp_path):
    hf_cfg = to_hf_config(get_preset("llama-tiny"))
    hf_cfg["rope_parameters"] = {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0}
    (tmp_path / "config.json").write_text(json.dumps(hf_cfg))
    with pytest.raises(ValueError, match="llama3"):
        import_hf(tmp_path)
