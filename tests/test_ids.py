"""Sample ids are pinned: every existing output directory resumes by them, so a change to the id
rule (hash, canonical form, truncation) must fail here, not silently regenerate everything."""

from __future__ import annotations

import json

from draftsmith.data.conversation import content_hash_id, conversation_from_row
from draftsmith.data.prompts import load_prompts

PROMPT = [{"role": "user", "content": "What is 2+2?"}]
PINNED = "h1c2da8a2ed7b5c3445a5a06c"


def test_the_id_of_a_known_prompt_is_pinned():
    assert content_hash_id(PROMPT) == PINNED
    unicode_prompt = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Héllo, 世界"}]
    assert content_hash_id(unicode_prompt) == "h59c6cc6c568cecbdc897825c"


def test_a_prompt_file_and_its_generated_row_get_the_pinned_id(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"messages": PROMPT}) + "\n")
    samples, _ = load_prompts(prompts)
    assert [sample.id for sample in samples] == [PINNED]
    answered = conversation_from_row({"messages": [*PROMPT, {"role": "assistant", "content": "4"}]}, "row 1")
    assert answered.id == PINNED
