"""`models convert --chat-template`: every template is rendered on probe conversations under a time,
memory and size budget before anything is converted; one that never finishes, recurses, builds
gigabytes or raises on a plain conversation is one line, exit 2, and nothing is written. A path that
is not a plain file is named as what it is."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from draftsmith.core.errors import InputError
from draftsmith.data.template_probe import probe_chat_template
from draftsmith.models.convert import convert_gguf, read_chat_template
from tiny_gguf import write_tiny_gguf

# Each hostile template and the words of its refusal.
HOSTILE = {
    "loops 10^10 times": ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                          "did not finish rendering a 1-message probe conversation (user) within"),
    "recurses forever": ("{% macro f(x) %}{{ f(x) }}{% endmacro %}{{ f(1) }}", "recurses without end"),
    "builds a 10 GB string": ("{{ 'x' * 10000000000 }}", "GiB of memory to render"),
    "renders megabytes": ("{% for i in range(100000) %}{{ 'abcdefghijklmnopqrstuvwxyz' }}{% endfor %}",
                          "to 2,600,000 characters, over the 1,000,000 allowed"),
    "raises": ("{{ raise_exception('this template refuses everything') }}",
               "raises on a 1-message probe conversation (user), which every chat template must render "
               "(TemplateError: this template refuses everything)"),
}
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def base_gguf(tmp_path_factory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "base.gguf", template=None)


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_template_is_refused_before_converting(case, base_gguf, tmp_path):
    text, words = HOSTILE[case]
    template = tmp_path / "chat.jinja"
    template.write_text(text)
    with pytest.raises(InputError) as refused:
        convert_gguf(base_gguf, tmp_path / "hf", chat_template=template, out_flag="--out")
    message = str(refused.value)
    assert message.startswith(f"--chat-template {template}: the chat template ") and words in message, message
    assert "\n" not in message and not (tmp_path / "hf").exists()


def test_a_template_may_refuse_a_shape_it_does_not_support_but_must_render_plain_turns():
    no_system = ("{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
                 + CHATML)
    probe_chat_template(no_system, "here")  # Gemma-style: a system role raises, by design
    probe_chat_template(CHATML, "here")
    with pytest.raises(InputError, match="raises on a 2-message probe conversation"):
        probe_chat_template("{% if not add_generation_prompt %}{{ raise_exception('x') }}{% endif %}", "here")


def test_the_cli_refuses_a_looping_template_in_one_line_exit_2(base_gguf, tmp_path):
    template = tmp_path / "loop.jinja"
    template.write_text(HOSTILE["loops 10^10 times"][0])
    result = subprocess.run([sys.executable, "-m", "draftsmith", "models", "convert", "--gguf", str(base_gguf),
                             "--out", str(tmp_path / "hf"), "--chat-template", str(template)],
                            capture_output=True, text=True, env={**os.environ, "PYTHONPATH": "src"}, timeout=600)
    assert result.returncode == 2 and "Traceback" not in result.stderr and result.stdout == "", result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(f"draftsmith: error: --chat-template {template}: the "
                                                             "chat template did not finish rendering")
    assert "converting" not in result.stderr and not (tmp_path / "hf").exists()


def test_a_template_path_that_is_not_a_plain_file_is_named_as_what_it_is(tmp_path):
    fifo = tmp_path / "fifo.jinja"
    os.mkfifo(fifo)
    link = tmp_path / "zero.jinja"
    link.symlink_to("/dev/zero")
    for path, kind in ((tmp_path, "a directory"), (fifo, "a FIFO"), (Path("/dev/zero"), "a character device"),
                       (link, "a character device")):
        with pytest.raises(InputError) as refused:
            read_chat_template(path)
        assert str(refused.value).startswith(f"--chat-template {path}: not a regular file ({kind})"), refused.value
    with pytest.raises(InputError, match="no such file"):
        read_chat_template(tmp_path / "absent.jinja")
