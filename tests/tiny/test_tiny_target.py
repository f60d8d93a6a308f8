import json

import torch

from draftsmith.tiny import synthetic_conversations, synthetic_prompts


def test_corpus_is_deterministic_and_ids_are_unique():
    first = list(synthetic_conversations(200, seed=3))
    second = list(synthetic_conversations(200, seed=3))
    assert first == second
    assert len({row["id"] for row in first}) == 200
    assert all(row["messages"][-1]["role"] == "assistant" for row in first)
    assert any(len(row["messages"]) >= 4 for row in first), "some rows should be multi-turn"


def test_prompts_drop_the_final_answer():
    for row in synthetic_prompts(50):
        assert row["messages"][-1]["role"] == "user"


def test_template_keeps_reasoning_only_on_the_final_turn(tiny_tokenizer):
    messages = [
        {"role": "user", "content": "Reverse the word apple."},
        {"role": "assistant", "content": "The reversed word is elppa.", "reasoning_content": "old"},
        {"role": "user", "content": "Spell tiger letter by letter."},
        {"role": "assistant", "content": "tiger is spelled t-i-g-e-r.", "reasoning_content": "new"},
    ]
    text = tiny_tokenizer.apply_chat_template(messages, tokenize=False)
    assert "old" not in text
    assert "<think>\nnew\n</think>\n\ntiger is spelled t-i-g-e-r.<|im_end|>\n" in text
    thinking_off = tiny_tokenizer.apply_chat_template(
        messages[:1], tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    assert thinking_off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_think_tags_are_single_non_special_tokens(tiny_tokenizer):
    ids = tiny_tokenizer("<think>\nx\n</think>")["input_ids"]
    assert tiny_tokenizer.convert_ids_to_tokens(ids)[0] == "<think>"
    assert tiny_tokenizer.decode(ids, skip_special_tokens=True) == "<think>\nx\n</think>"
    assert "<|MASK|>" in tiny_tokenizer.get_vocab()


def test_trained_target_follows_the_task_format(tiny_target_dir, tiny_tokenizer):
    from transformers import AutoModelForCausalLM

    meta = json.loads((tiny_target_dir / "draftsmith_tiny.json").read_text())
    assert meta["final_loss"] < 1.0, meta
    model = AutoModelForCausalLM.from_pretrained(tiny_target_dir)
    prompt = tiny_tokenizer.apply_chat_template(
        [{"role": "user", "content": "Count from 4 to 9."}], tokenize=False, add_generation_prompt=True
    )
    ids = tiny_tokenizer(prompt, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=80, do_sample=False)
    text = tiny_tokenizer.decode(out[0, ids.shape[1]:])
    assert text.startswith("<think>\n"), text
    assert "</think>" in text and "<|im_end|>" in text, text
