"""Builders of one tiny target started together train it once: the others wait and reuse it."""

from __future__ import annotations

import threading

from draftsmith.tiny.build import TinyTargetSpec, build_tiny_target


def test_two_builders_of_one_target_build_it_once(tmp_path):
    spec = TinyTargetSpec(train_conversations=40, train_steps=2, batch_size=4, hidden_size=32, intermediate_size=64,
                          num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=16, vocab_size=400)
    messages: list[str] = []
    results: list = []

    def build() -> None:
        results.append(build_tiny_target(tmp_path / "tiny", spec=spec, log=messages.append))

    threads = [threading.Thread(target=build) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    assert len(results) == 2 and results[0] == results[1] == tmp_path / "tiny"
    assert sum("written to" in message for message in messages) == 1, messages
    assert (tmp_path / "tiny" / "draftsmith_tiny.json").is_file()
    assert not list(tmp_path.glob(".building-*"))
