"""The thinking mode a stage defaults to follows what the target's chat template supports."""

from __future__ import annotations

import json

from draftsmith.data.thinking import choose_thinking, read_chat_template, thinking_support
from draftsmith.tiny.build import chat_template
from draftsmith.tiny.families import FAMILIES

ALWAYS = "{% for m in messages %}{{ m.content }}{% endfor %}{% if add_generation_prompt %}<think>\n{% endif %}"


def test_templates_are_told_apart():
    assert thinking_support(chat_template()) == "switch"
    assert {thinking_support(FAMILIES[name].template) for name in ("llama3", "qwen2.5", "gemma3", "mistral")} == {"none"}
    assert thinking_support(ALWAYS) == "always"
    assert thinking_support(None) == "unknown"
    assert thinking_support({"default": chat_template(), "tool_use": "x"}) == "switch"


def test_defaults_follow_the_template_and_the_old_default_stays_where_it_is_unknown():
    none = choose_thinking(FAMILIES["llama3"].template)
    assert (none.kwargs, none.expect_reasoning, none.chosen_by_default) == ({}, False, True)
    assert "thinking off (default; enable_thinking not sent)" in none.line
    # A switch the template ignores is not sent: the recorded settings match the default's, so a resume does too.
    assert choose_thinking(FAMILIES["llama3"].template, thinking=False).kwargs == none.kwargs
    assert choose_thinking(ALWAYS).expect_reasoning is True and choose_thinking(ALWAYS).kwargs == {}
    switch = choose_thinking(chat_template())
    assert (switch.kwargs, switch.expect_reasoning) == ({"enable_thinking": True}, True)
    off = choose_thinking(chat_template(), {"enable_thinking": False})
    assert (off.kwargs, off.expect_reasoning, off.chosen_by_default) == ({"enable_thinking": False}, False, False)
    assert choose_thinking(None).kwargs == {"enable_thinking": True}  # unknown: as before
    assert choose_thinking(chat_template(), send_default=False).kwargs == {}


def test_the_template_is_read_from_the_files_of_a_model_directory(tmp_path):
    assert read_chat_template(tmp_path) is None
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": [{"name": "default", "template": ALWAYS}]}))
    assert read_chat_template(tmp_path) == ALWAYS
    (tmp_path / "chat_template.jinja").write_text(chat_template())
    assert thinking_support(read_chat_template(tmp_path)) == "switch"
