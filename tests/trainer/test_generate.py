"""Sampling: greedy decoding agrees with transformers' `generate`, sampling is seeded, and a model
that learned a sentence recites it and stops at end-of-document."""

import json

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from trainer.export import export_hf
from trainer.generate import generate, main
from trainer.models import build_model, get_preset

torch.set_num_threads(1)
SENTENCE = "the quick brown fox jumps over the lazy dog"
CORPUS = [SENTENCE, "import os\nprint(os.getcwd())", "def add(a, b):\n    return a + b"] * 30


class BPE:
    """The tokenizer interface generate() needs, over a byte-level BPE trained here."""

    def __init__(self, path):
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.train_from_iterator(
            CORPUS,
            trainers.BpeTrainer(
                vocab_size=300,
                special_tokens=["<|endoftext|>"],
                initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                show_progress=False,
            ),
        )
        tok.save(str(path))
        self.tok, self.eod_id, self.vocab_size = tok, tok.token_to_id("<|endoftext|>"), tok.get_vocab_size()

    def encode(self, text):
        return self.tok.encode(text).ids

    def decode(self, ids):
        return self.tok.decode(list(ids))


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return BPE(tmp_path_factory.mktemp("tok") / "tokenizer.json")


def _model(tokenizer, name="pythia-tiny", seed=0):
    model = build_model(get_preset(name, vocab_size=tokenizer.vocab_size, init_std=0.2))
    model.init_weights(seed=seed)
    return model


@pytest.mark.parametrize("name", ["pythia-tiny", "llama-tiny"])
def test_greedy_matches_transformers_generate(name, tokenizer, tmp_path):
    transformers = pytest.importorskip("transformers")
    model = _model(tokenizer, name)
    export_hf(model.state_dict(), model.cfg, tmp_path)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    prompt = "def add(a"
    ids = torch.tensor([tokenizer.encode(prompt)])
    expected = hf.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0)
    expected_new = expected[0, ids.shape[1] :].tolist()
    assert len(expected_new) == 12
    # Let ours run the full 12 tokens too, whatever it samples.
    no_eod = type("NoEod", (), {"encode": tokenizer.encode, "decode": tokenizer.decode, "eod_id": None})()
    [text] = generate(model, no_eod, [prompt], max_new_tokens=12, temperature=0)
    assert text == tokenizer.decode(expected_new)


def test_sampling_is_seeded(tokenizer):
    model = _model(tokenizer)
    prompts = ["import", "the quick"]
    a = generate(model, tokenizer, prompts, max_new_tokens=16, temperature=1.0, top_k=50, seed=1)
    b = generate(model, tokenizer, prompts, max_new_tokens=16, temperature=1.0, top_k=50, seed=1)
    c = generate(model, tokenizer, prompts, max_new_tokens=16, temperature=1.0, top_k=50, seed=2)
    assert a == b and a != c and len(a) == 2
    greedy = generate(model, tokenizer, prompts, max_new_tokens=16, temperature=0)
    assert generate(model, tokenizer, prompts, max_new_tokens=16, temperature=1.0, top_k=1, seed=3) == greedy


def test_learned_sentence_is_recited_then_stops(tokenizer):
    torch.manual_seed(0)
    model = build_model(get_preset("pythia-tiny", vocab_size=tokenizer.vocab_size))
    ids = torch.tensor([tokenizer.encode(SENTENCE) + [tokenizer.eod_id]])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(150):
        loss = torch.nn.functional.cross_entropy(model(ids[:, :-1])[0], ids[0, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.05
    model.train()
    [text] = generate(model, tokenizer, ["the quick brown"], max_new_tokens=40, temperature=0)
    assert text == SENTENCE.removeprefix("the quick brown")  # and nothing after the end-of-document
    assert model.training  # mode restored


def test_cli_samples_an_exported_directory(tokenizer, tmp_path, capsys):
    model = _model(tokenizer)
    tokenizer.tok.save(str(tmp_path / "tok.json"))
    export_hf(model.state_dict(), model.cfg, tmp_path, tokenizer_path=tmp_path / "tok.json")
    main([str(tmp_path), "--prompt", "import", "--prompt", "def", "--max-new-tokens", "5", "--temperature", "0"])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["prompt"] for line in lines] == ["import", "def"]
    assert lines[0]["completion"] == generate(model, tokenizer, ["import"], max_new_tokens=5, temperature=0)[0]
