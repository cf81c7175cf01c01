"""Hugging Face model directories in and out: `GPTNeoXForCausalLM` and `LlamaForCausalLM`.

Our state dicts use our own names (`layers.3.attn.wqkv.weight`); this module is the one place
that knows Hugging Face's. Two layouts differ besides names:

- GPT-NeoX's `query_key_value` interleaves q, k, v per head (rows [h0: q k v | h1: q k v | ...]);
  ours stacks them ([all q | all k | all v]) so that q, k and v split off one matmul.
- LLaMA's q/k/v are separate matrices in Hugging Face; ours are one (`wqkv`), concatenated
  along the output dimension.

RoPE needs no permutation: our models rotate in Hugging Face's "rotate half" convention (see
`trainer.models.rope`), so q/k rows mean the same thing in both. (Meta's original consolidated
checkpoints use interleaved pairs; Hugging Face's conversion script permutes them once into this
convention, which is why checkpoints on the Hub already match us.)

Config files are written in the classic field names (`rotary_pct`, `rotary_emb_base`,
`rope_theta`) that every transformers version reads, plus the `rope_parameters` of transformers 5.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

from trainer.models.config import ModelConfig

SAFETENSORS_NAME = "model.safetensors"
_EOD_CANDIDATES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>")
_BOS_CANDIDATES = ("<s>", "<|begin_of_text|>", "<|endoftext|>")


# ---------------------------------------------------------------------------------------- config


def to_hf_config(cfg: ModelConfig, bos_token_id: int | None = None, eos_token_id: int | None = None) -> dict[str, Any]:
    """The `config.json` of the equivalent Hugging Face model."""
    common = {
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "intermediate_size": cfg.intermediate_size,
        "max_position_embeddings": cfg.max_seq_len,
        "initializer_range": cfg.init_std,
        "tie_word_embeddings": cfg.tie_embeddings,
        "attention_dropout": 0.0,
        "bos_token_id": bos_token_id,
        "eos_token_id": eos_token_id,
        "use_cache": True,
        "torch_dtype": "float32",
    }
    if cfg.family == "gpt_neox":
        return {
            "architectures": ["GPTNeoXForCausalLM"],
            "model_type": "gpt_neox",
            **common,
            "hidden_act": "gelu",
            "rotary_pct": cfg.rotary_pct,
            "rotary_emb_base": cfg.rope_theta,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": cfg.rope_theta,
                "partial_rotary_factor": cfg.rotary_pct,
            },
            "layer_norm_eps": cfg.norm_eps,
            "use_parallel_residual": cfg.use_parallel_residual,
            "attention_bias": True,
            "hidden_dropout": 0.0,
        }
    if cfg.rotary_pct != 1.0:
        raise ValueError("LlamaForCausalLM rotates whole heads; rotary_pct must be 1.0")
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        **common,
        "num_key_value_heads": cfg.kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "attention_bias": False,
        "mlp_bias": False,
        "pretraining_tp": 1,
    }


def _rope_field(hf: dict[str, Any], key: str, *legacy: str, default: Any) -> Any:
    params = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    if key in params:
        return params[key]
    return next((hf[k] for k in legacy if hf.get(k) is not None), default)


def from_hf_config(hf: dict[str, Any]) -> ModelConfig:
    """Our config for a Hugging Face `config.json`; refuses variants our models do not implement."""
    model_type = hf.get("model_type")
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise ValueError(f"RoPE scaling {rope_type!r} is not supported (only plain RoPE)")
    common = dict(
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        num_layers=hf["num_hidden_layers"],
        num_heads=hf["num_attention_heads"],
        intermediate_size=hf["intermediate_size"],
        max_seq_len=hf.get("max_position_embeddings", 2048),
        init_std=hf.get("initializer_range", 0.02),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
    )
    if model_type == "gpt_neox":
        if hf.get("hidden_act", "gelu") != "gelu" or not hf.get("attention_bias", True):
            raise ValueError("only GPT-NeoX with exact GELU and attention biases is supported")
        return ModelConfig(
            family="gpt_neox",
            **common,
            rotary_pct=float(
                _rope_field(hf, "partial_rotary_factor", "rotary_pct", "partial_rotary_factor", default=0.25)
            ),
            rope_theta=float(_rope_field(hf, "rope_theta", "rotary_emb_base", "rope_theta", default=10000.0)),
            use_parallel_residual=bool(hf.get("use_parallel_residual", True)),
            norm_eps=hf.get("layer_norm_eps", 1e-5),
        )
    if model_type == "llama":
        head_dim = hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]
        if head_dim * hf["num_attention_heads"] != hf["hidden_size"]:
            raise ValueError("LLaMA variants with head_dim * heads != hidden_size are not supported")
        if hf.get("attention_bias") or hf.get("mlp_bias") or hf.get("hidden_act", "silu") != "silu":
            raise ValueError("only LLaMA without biases and with SiLU (SwiGLU) is supported")
        return ModelConfig(
            family="llama",
            **common,
            num_kv_heads=hf.get("num_key_value_heads") or hf["num_attention_heads"],
            rope_theta=float(_rope_field(hf, "rope_theta", "rope_theta", default=10000.0)),
            norm_eps=hf.get("rms_norm_eps", 1e-6),
        )
    raise ValueError(f"unsupported Hugging Face model_type {model_type!r} (gpt_neox or llama)")


# ------------------------------------------------------------------------------------ state dict


def _neox_qkv_to_hf(t: torch.Tensor, heads: int) -> torch.Tensor:
    """[q heads | k heads | v heads] rows -> per-head [q k v] rows (weight or bias)."""
    rest = t.shape[1:]
    return t.reshape(3, heads, -1, *rest).transpose(0, 1).reshape(t.shape)


def _neox_qkv_from_hf(t: torch.Tensor, heads: int) -> torch.Tensor:
    rest = t.shape[1:]
    return t.reshape(heads, 3, -1, *rest).transpose(0, 1).reshape(t.shape)


# Our name -> Hugging Face's, for the tensors whose layout is the same in both: per model, and per
# layer (under `layers.N.` / the prefix). The fused q/k/v (`attn.wqkv`) is converted beside them.
_NEOX_TOP = {
    "embed.weight": "gpt_neox.embed_in.weight",
    "norm.weight": "gpt_neox.final_layer_norm.weight",
    "norm.bias": "gpt_neox.final_layer_norm.bias",
}
_NEOX_LAYER = {
    f"{ours}.{p}": f"{hf}.{p}"
    for ours, hf in (
        ("attn_norm", "input_layernorm"),
        ("mlp_norm", "post_attention_layernorm"),
        ("attn.wo", "attention.dense"),
        ("mlp.w_in", "mlp.dense_h_to_4h"),
        ("mlp.w_out", "mlp.dense_4h_to_h"),
    )
    for p in ("weight", "bias")
}
_LLAMA_TOP = {"embed.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight"}
_LLAMA_LAYER = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn.wo.weight": "self_attn.o_proj.weight",
    "mlp_norm.weight": "post_attention_layernorm.weight",
    "mlp.w_gate.weight": "mlp.gate_proj.weight",
    "mlp.w_up.weight": "mlp.up_proj.weight",
    "mlp.w_down.weight": "mlp.down_proj.weight",
}


def _hf_layer(cfg: ModelConfig, i: int) -> str:
    return f"gpt_neox.layers.{i}." if cfg.family == "gpt_neox" else f"model.layers.{i}."


def _renamed(cfg: ModelConfig) -> dict[str, str]:
    """Our name -> Hugging Face's for every tensor of `cfg`'s model that only changes its name."""
    top, layer = (_NEOX_TOP, _NEOX_LAYER) if cfg.family == "gpt_neox" else (_LLAMA_TOP, _LLAMA_LAYER)
    names = dict(top)
    for i in range(cfg.num_layers):
        names.update({f"layers.{i}.{ours}": _hf_layer(cfg, i) + hf for ours, hf in layer.items()})
    return names


def to_hf_state_dict(state_dict: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Our parameter names and layouts -> Hugging Face's (tensors are new, contiguous, detached).
    Sharded (FSDP2 DTensor) entries are gathered whole, which is collective: call on every rank."""
    sd = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach() for k, v in state_dict.items()}
    out = {hf: sd[ours] for ours, hf in _renamed(cfg).items()}
    q, kv = cfg.num_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
    for i in range(cfg.num_layers):
        wqkv, hf = f"layers.{i}.attn.wqkv.", _hf_layer(cfg, i)
        if cfg.family == "gpt_neox":
            for p in ("weight", "bias"):
                out[hf + f"attention.query_key_value.{p}"] = _neox_qkv_to_hf(sd[wqkv + p], cfg.num_heads)
        else:
            for name, t in zip("qkv", sd[wqkv + "weight"].split([q, kv, kv], dim=0)):
                out[hf + f"self_attn.{name}_proj.weight"] = t
    if not cfg.tie_embeddings:
        # embed_out: Pythia's name for the GPT-NeoX head (transformers 5 maps it to lm_head).
        out["embed_out.weight" if cfg.family == "gpt_neox" else "lm_head.weight"] = sd["output.weight"]
    return {k: v.contiguous().clone() for k, v in out.items()}


def from_hf_state_dict(hf_sd: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Hugging Face names and layouts -> ours. Raises KeyError naming any missing tensor."""
    out = {ours: hf_sd[hf] for ours, hf in _renamed(cfg).items()}
    for i in range(cfg.num_layers):
        wqkv, hf = f"layers.{i}.attn.wqkv.", _hf_layer(cfg, i)
        if cfg.family == "gpt_neox":
            for p in ("weight", "bias"):
                out[wqkv + p] = _neox_qkv_from_hf(hf_sd[hf + f"attention.query_key_value.{p}"], cfg.num_heads)
        else:
            out[wqkv + "weight"] = torch.cat([hf_sd[hf + f"self_attn.{p}_proj.weight"] for p in "qkv"], dim=0)
    head = "embed_out.weight" if cfg.family == "gpt_neox" and "embed_out.weight" in hf_sd else "lm_head.weight"
    if not cfg.tie_embeddings:
        # A checkpoint saved with tied embeddings may omit the head even if the config unties it.
        out["output.weight"] = hf_sd.get(head, out["embed.weight"])
    return {k: v.contiguous() for k, v in out.items()}


# --------------------------------------------------------------------------------- directories


def _special_token_ids(tokenizer_json: Path) -> tuple[int | None, int | None]:
    """(bos, eos) ids from a tokenizer.json's added special tokens, by their usual names."""
    added = {t["content"]: t["id"] for t in json.loads(tokenizer_json.read_text()).get("added_tokens", [])}
    eos = next((added[t] for t in _EOD_CANDIDATES if t in added), None)
    bos = next((added[t] for t in _BOS_CANDIDATES if t in added), eos)
    return bos, eos


def _copy_tokenizer(tokenizer_path: str | Path, out_dir: Path, max_seq_len: int) -> tuple[int | None, int | None]:
    src = Path(tokenizer_path)
    src_json = src / "tokenizer.json" if src.is_dir() else src
    if not src_json.is_file():
        raise FileNotFoundError(f"no tokenizer.json at {tokenizer_path}")
    shutil.copyfile(src_json, out_dir / "tokenizer.json")
    bos, eos = _special_token_ids(src_json)
    vocab = {v: k for k, v in json.loads(src_json.read_text())["model"].get("vocab", {}).items()}
    added = {t["id"]: t["content"] for t in json.loads(src_json.read_text()).get("added_tokens", [])}
    name = lambda i: None if i is None else added.get(i, vocab.get(i))  # noqa: E731
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": max_seq_len,
        "bos_token": name(bos),
        "eos_token": name(eos),
        "unk_token": name(eos),
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")
    return bos, eos


def export_hf(
    state_dict: dict[str, torch.Tensor],
    cfg: ModelConfig,
    out_dir: str | Path,
    tokenizer_path: str | Path | None = None,
    dtype: torch.dtype | None = None,
) -> Path:
    """Writes a Hugging Face model directory: `config.json`, `model.safetensors`, and, given a
    tokenizer (a tokenizer.json or a directory holding one), `tokenizer.json` +
    `tokenizer_config.json`. `dtype` casts floating tensors (e.g. torch.bfloat16) on the way out.
    `AutoModelForCausalLM.from_pretrained(out_dir)` loads the result."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    bos = eos = None
    if tokenizer_path is not None:
        bos, eos = _copy_tokenizer(tokenizer_path, out, cfg.max_seq_len)
    tensors = to_hf_state_dict(state_dict, cfg)
    if dtype is not None:
        tensors = {k: v.to(dtype) if v.is_floating_point() else v for k, v in tensors.items()}
    tensors = {k: v.cpu() for k, v in tensors.items()}
    hf_config = to_hf_config(cfg, bos_token_id=bos, eos_token_id=eos)
    if dtype is not None:
        hf_config["torch_dtype"] = str(dtype).removeprefix("torch.")
    save_file(tensors, str(out / SAFETENSORS_NAME), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
    generation = {"bos_token_id": bos, "eos_token_id": eos}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    (out / "aerie_model_config.json").write_text(json.dumps(cfg.to_dict(), indent=2) + "\n")
    return out


def _load_hf_tensors(hf_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    index = hf_dir / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        tensors: dict[str, torch.Tensor] = {}
        for f in files:
            tensors.update(load_file(str(hf_dir / f)))
        return tensors
    if (hf_dir / SAFETENSORS_NAME).is_file():
        return load_file(str(hf_dir / SAFETENSORS_NAME))
    if (hf_dir / "pytorch_model.bin").is_file():
        return torch.load(hf_dir / "pytorch_model.bin", map_location="cpu", weights_only=True)
    raise FileNotFoundError(f"no model.safetensors(.index.json) or pytorch_model.bin in {hf_dir}")


def import_hf(hf_dir: str | Path) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """Reads a Hugging Face GPT-NeoX or LLaMA directory into our config and state dict (tensors
    keep the checkpoint's dtype). `build_model(cfg).load_state_dict(sd)` then reproduces it."""
    d = Path(hf_dir)
    cfg = from_hf_config(json.loads((d / "config.json").read_text()))
    return cfg, from_hf_state_dict(_load_hf_tensors(d), cfg)
