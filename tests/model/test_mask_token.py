"""The mask token is chosen from the target when its tokenizer has no <|MASK|>: one rule, printed."""

from __future__ import annotations

import pytest

from draftsmith.model.features import choose_mask_token, mask_token_for
from draftsmith.tiny.families import FAMILIES, build_family_target, build_family_tokenizer


@pytest.fixture(scope="module")
def tokenizers():
    return {name: build_family_tokenizer(family) for name, family in FAMILIES.items()}


def test_the_tokenizers_own_mask_token_comes_first(tiny_tokenizer):
    choice = choose_mask_token(tiny_tokenizer, len(tiny_tokenizer))
    assert (choice.token, choice.source) == ("<|MASK|>", "mask_token")
    assert choice.token_id == tiny_tokenizer.convert_tokens_to_ids("<|MASK|>")


def test_a_padded_embedding_table_gives_its_first_padding_row(tokenizers):
    tokenizer = tokenizers["qwen2.5"]
    choice = choose_mask_token(tokenizer, len(tokenizer) + 32)
    assert (choice.token_id, choice.token, choice.source) == (len(tokenizer), None, "padding_row")


def test_an_unused_reserved_token_is_next_and_never_one_the_template_uses(tokenizers):
    llama = tokenizers["llama3"]
    choice = choose_mask_token(llama, len(llama))
    assert (choice.token, choice.source) == ("<|reserved_special_token_3|>", "reserved_token")
    gemma = tokenizers["gemma3"]
    assert choose_mask_token(gemma, len(gemma)).token == "<unused1>"
    # A reserved token the chat template renders is in use: the next one is taken.
    llama.chat_template += "{{ '<|reserved_special_token_3|>' }}"
    assert choose_mask_token(llama, len(llama)).token == "<|reserved_special_token_2|>"


def test_the_tokenizers_own_mask_token_beats_an_unused_reserved_one_unless_the_template_writes_it(tokenizers):
    gemma = tokenizers["gemma3-gguf"]  # Gemma's tokenizer has <mask> beside its <unusedN>
    choice = choose_mask_token(gemma, len(gemma))
    assert (choice.token_id, choice.token, choice.source) == (gemma.convert_tokens_to_ids("<mask>"), "<mask>", "tokenizer_mask")
    assert "own mask token" in choice.describe()
    gemma.chat_template += "{{ '<mask>' }}"  # a template that writes it: it is in use
    assert choose_mask_token(gemma, len(gemma)).token == "<unused1>"


def test_a_pad_token_distinct_from_eos_is_the_last_tokenizer_id(tokenizers):
    mistral = tokenizers["mistral"]
    choice = choose_mask_token(mistral, len(mistral))
    assert (choice.token, choice.source) == ("<pad>", "pad_token")


def test_with_no_spare_id_the_drafter_owns_a_mask_embedding_in_place_of_eos(tokenizers):
    # Mistral v0.1's shape: the tokenizer fills the table, no pad, no reserved token.
    nopad = tokenizers["mistral-nopad"]
    assert nopad.pad_token is None and not any("control" in t or "reserved" in t for t in nopad.get_vocab())
    choice = choose_mask_token(nopad, len(nopad))
    assert (choice.token_id, choice.token, choice.source) == (nopad.eos_token_id, "</s>", "drafter_embedding")
    assert "mask_embedding.pt" in choice.describe()
    # A pad token that is eos is no spare id either.
    mistral = tokenizers["mistral"]
    mistral.pad_token = mistral.eos_token
    assert choose_mask_token(mistral, len(mistral)).source == "drafter_embedding"


def test_the_mask_embedding_replaces_every_mask_position_and_ships_as_vllm_reads_it(tmp_path):
    import torch

    from draftsmith.model import DFlashDraftModel, build_drafter_config, load_drafter, save_drafter
    from draftsmith.model.drafter import replace_mask_rows
    from draftsmith.model.io import mask_embedding_state, read_mask_embedding_file

    target = build_family_target("mistral-nopad", tmp_path / "target")
    choice = mask_token_for(target)
    from draftsmith.model.target import load_target_config

    config = build_drafter_config(load_target_config(target), num_draft_layers=1, block_size=4,
                                  mask_token_id=choice.token_id)
    config.dflash_config = {**config.dflash_config, **choice.record()}
    drafter = DFlashDraftModel(config)
    assert drafter.mask_embedding is not None and drafter.mask_embedding.shape == (config.hidden_size,)
    assert DFlashDraftModel(build_drafter_config(load_target_config(target), num_draft_layers=1, block_size=4,
                                                 mask_token_id=choice.token_id)).mask_embedding is None

    block = torch.tensor([[7, choice.token_id, choice.token_id, 9]])
    noise = torch.randn(1, 4, config.hidden_size)
    replaced = replace_mask_rows(noise, block, choice.token_id, drafter.mask_embedding)
    torch.testing.assert_close(replaced[0, 1:3], drafter.mask_embedding.detach().expand(2, -1))
    torch.testing.assert_close(replaced[0, [0, 3]], noise[0, [0, 3]])

    save_drafter(drafter, tmp_path / "drafter")
    token_id, embedding = read_mask_embedding_file(tmp_path / "drafter" / "mask_embedding.pt")
    assert token_id == choice.token_id and embedding.shape == (config.hidden_size,)
    # vLLM's qwen3_dflash `_read_mask_embedding`: torch.load(weights_only=True) of a dict with these keys.
    raw = torch.load(tmp_path / "drafter" / "mask_embedding.pt", weights_only=True)
    assert sorted(raw) == ["embedding", "mask_token_id"]
    reloaded = load_drafter(tmp_path / "drafter")
    torch.testing.assert_close(reloaded.mask_embedding, drafter.mask_embedding)
    (tmp_path / "drafter" / "mask_embedding.pt").unlink()
    from draftsmith.core.errors import InputError

    with pytest.raises(InputError, match="mask_embedding.pt: not found"):
        mask_embedding_state(tmp_path / "drafter", config)


def test_mask_token_for_prints_the_choice_and_names_a_target_without_one(tmp_path, capsys):
    from draftsmith.core.errors import InputError

    target = build_family_target("llama3", tmp_path / "llama3")
    choice = mask_token_for(target)
    assert "mask token id" in capsys.readouterr().err and choice.source == "reserved_token"
    assert mask_token_for(target, override=3).source == "override"
    with pytest.raises(InputError, match="--mask-token-id 999999 is outside"):
        mask_token_for(target, override=999999)


def test_the_drafter_config_ties_its_head_as_the_target_does(tiny_target):
    from transformers import Gemma3TextConfig

    from draftsmith.model import build_drafter_config

    tied = Gemma3TextConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                            num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    assert build_drafter_config(tied, num_draft_layers=1, mask_token_id=3).tie_word_embeddings is True
    assert build_drafter_config(tiny_target.config, num_draft_layers=1, mask_token_id=3).tie_word_embeddings is False
    # Gemma 3 keeps RoPE per layer type; the drafter's full-attention layers take the full-attention set.
    rope = build_drafter_config(tied, num_draft_layers=1, mask_token_id=3).rope_parameters
    assert rope == tied.rope_parameters["full_attention"]


@pytest.mark.parametrize("token_id", ["abc", 1.5, -3, True, [3]])
def test_a_mask_token_id_that_is_no_token_id_is_one_line(tmp_path, token_id):
    """`mask_token_id` "abc" in mask_embedding.pt was a ValueError traceback (issue 34 item 8)."""
    import torch

    from draftsmith.core.errors import InputError
    from draftsmith.model.io import read_mask_embedding_file

    path = tmp_path / "mask_embedding.pt"
    torch.save({"mask_token_id": token_id, "embedding": torch.zeros(8)}, str(path))
    with pytest.raises(InputError, match=r"mask_embedding.pt: mask_token_id is .*expected a token id"):
        read_mask_embedding_file(path)
    torch.save({"mask_token_id": torch.tensor(7), "embedding": torch.zeros(8)}, str(path))
    assert read_mask_embedding_file(path)[0] == 7
