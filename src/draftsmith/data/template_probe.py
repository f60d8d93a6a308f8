"""Render a chat template on probe conversations, bounded in time, memory and output, before using it.

A chat template is a program (Jinja), and transformers' sandbox only stops it from reaching files and
Python internals: it still runs a loop of 10^10 steps, recurses until Python's stack gives out, or
builds a 10 GB string, and `tokenize` would meet that on its first row (after a convert that published
the template with exit 0). So every template a stage takes in (`models convert --chat-template`, a
GGUF's own, the tokenizer's before `tokenize`) is rendered here first, the way `apply_chat_template`
renders it (transformers' `render_jinja_template`, the same sandbox and globals).

The render runs in a child process, not a thread: a thread cannot be stopped (Python has no thread
kill) and one C-level string repetition (`'x' * 10**10`) never returns to the interpreter for a timer to
fire. The child gets an address-space limit (a huge string is a MemoryError there, not the machine's
memory), a CPU-time limit and a timer for the render budget; the parent also waits only so long and
kills it. What the child reports, or how it died, becomes one line naming the template.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from draftsmith.core.errors import InputError

# Seconds the probes may take to render, all together; real templates render them in milliseconds.
RENDER_BUDGET_S = 5.0
# Seconds the child may spend importing transformers' renderer before the budget starts (a loaded machine).
IMPORT_ALLOWANCE_S = 90.0
# Characters one probe conversation may render to: a few short messages render to a few hundred.
MAX_RENDER_CHARS = 1_000_000
# Address space the child may grow by past its imports: a template needing more is broken.
MEMORY_HEADROOM_BYTES = 2 << 30

# (messages, add_generation_prompt, must render): a template may refuse a shape it does not support
# (a system role, non-alternating turns) by raising, but it must render the plain ones, and none may hang.
PROBES: list[tuple[list[dict[str, Any]], bool, bool]] = [
    ([{"role": "user", "content": "What is 2 + 2?"}], True, True),
    ([{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "4."}], False, True),
    ([{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Name a colour."},
      {"role": "assistant", "content": "Blue."}, {"role": "user", "content": "Another one?"}], True, False),
    ([{"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello.", "reasoning_content": "Greet back."},
      {"role": "user", "content": "Bye."}, {"role": "assistant", "content": "Goodbye."}], False, False),
]

_CHILD = r"""
import json, os, resource, signal, sys
request = json.loads(sys.stdin.read())
from transformers.utils.chat_template_utils import render_jinja_template

def answer(**fields):
    sys.stdout.write(json.dumps(fields))
    sys.stdout.flush()
    os._exit(0)

def out_of_time(signum, frame):
    raise TimeoutError

try:
    pages = open("/proc/self/statm").read().split()
    used = int(pages[0]) * os.sysconf("SC_PAGE_SIZE")
    resource.setrlimit(resource.RLIMIT_AS, (used + request["headroom"], used + request["headroom"]))
except (OSError, ValueError, AttributeError):
    pass  # no /proc (not Linux): the parent's wall-clock limit still holds
signal.signal(signal.SIGALRM, out_of_time)
signal.setitimer(signal.ITIMER_REAL, request["budget"])
for index, (messages, generation, required) in enumerate(request["probes"]):
    try:
        rendered, _ = render_jinja_template(conversations=[messages], chat_template=request["template"],
                                            add_generation_prompt=generation, **request["kwargs"])
        size = len(rendered[0])
    except TimeoutError:
        answer(probe=index, problem="time")
    except RecursionError:
        answer(probe=index, problem="recursion")
    except MemoryError:
        answer(probe=index, problem="memory")
    except OverflowError as error:
        answer(probe=index, problem="overflow", detail=str(error)[:200])
    except Exception as error:
        if required:
            answer(probe=index, problem="raised", detail=(type(error).__name__ + ": " + " ".join(str(error).split()))[:200])
        continue
    if size > request["max_chars"]:
        answer(probe=index, problem="size", detail=size)
signal.setitimer(signal.ITIMER_REAL, 0)
answer(problem=None)
"""


def _describe(messages: list[dict[str, Any]]) -> str:
    return f"a {len(messages)}-message probe conversation ({'/'.join(m['role'] for m in messages)})"


# (template, variables) digests that rendered within bounds in this process: a test session or a
# pipeline that loads one tokenizer many times pays for the child process once.
_PASSED: set[str] = set()


def probe_chat_template(template: str, where: str, kwargs: dict[str, Any] | None = None,
                        budget_s: float = RENDER_BUDGET_S) -> None:
    """Render `template` on `PROBES` in a bounded child process; any way it fails is one `InputError`
    starting with `where` (e.g. "--chat-template FILE"). `kwargs` are the render's variables beside the
    messages: special tokens (`bos_token`, ...) and chat_template_kwargs (`enable_thinking`, ...)."""
    import hashlib

    key = hashlib.sha256(json.dumps([template, _plain(kwargs or {}), budget_s], sort_keys=True).encode()).hexdigest()
    if key in _PASSED:
        return
    _run_probes(template, where, kwargs, budget_s)
    _PASSED.add(key)


def _run_probes(template: str, where: str, kwargs: dict[str, Any] | None, budget_s: float) -> None:
    request = {"template": template, "probes": PROBES, "kwargs": _plain(kwargs or {}), "budget": float(budget_s),
               "max_chars": MAX_RENDER_CHARS, "headroom": MEMORY_HEADROOM_BYTES}
    cpu_limit = int(IMPORT_ALLOWANCE_S + budget_s) + 1

    def limit_cpu() -> None:  # runs in the child: a render the timer cannot interrupt is still stopped
        import resource

        resource.setrlimit(resource.RLIMIT_CPU, (cpu_limit, cpu_limit + 5))

    try:
        completed = subprocess.run([sys.executable, "-c", _CHILD], input=json.dumps(request), capture_output=True,
                                   text=True, timeout=IMPORT_ALLOWANCE_S + budget_s + 5,
                                   preexec_fn=limit_cpu if sys.platform != "win32" else None)
    except subprocess.TimeoutExpired:  # subprocess.run has killed it
        raise InputError(f"{where}: the chat template did not finish rendering a probe conversation within "
                         f"{budget_s:g} s (an endless loop?); a template must render in milliseconds") from None
    try:
        report = json.loads(completed.stdout)
    except ValueError:
        how = (f"killed by signal {-completed.returncode}" if completed.returncode < 0
               else f"exit status {completed.returncode}")
        tail = " ".join(completed.stderr.split())[-200:]
        raise InputError(f"{where}: rendering the chat template on a probe conversation failed ({how}"
                         f"{': ' + tail if tail else ''}); a template must render short conversations") from None
    problem = report.get("problem")
    if problem is None:
        return
    probe = _describe(PROBES[int(report["probe"])][0])
    detail = report.get("detail")
    lines = {
        "time": f"did not finish rendering {probe} within {budget_s:g} s (an endless loop?)",
        "recursion": f"recurses without end rendering {probe} (RecursionError)",
        "memory": f"needs more than {MEMORY_HEADROOM_BYTES >> 30} GiB of memory to render {probe} (MemoryError)",
        "overflow": f"overflows rendering {probe} ({detail})",
        "size": f"renders {probe} to {detail:,} characters, over the {MAX_RENDER_CHARS:,} allowed"
        if isinstance(detail, int) else f"renders {probe} too long",
        "raised": f"raises on {probe}, which every chat template must render ({detail})",
    }
    raise InputError(f"{where}: the chat template {lines.get(problem, problem)}")


def _plain(kwargs: dict[str, Any]) -> dict[str, Any]:
    """`kwargs` with what JSON cannot carry to the child (token objects) as strings."""
    return {key: value if isinstance(value, (str, int, float, bool, type(None), list, dict)) else str(value)
            for key, value in kwargs.items()}


# What a GGUF's special tokens are called before its tokenizer is built (`models convert` probes the
# template before the minutes-long conversion): the names matter only to templates that concatenate them.
PLACEHOLDER_TOKENS = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}


def tokenizer_template_variables(tokenizer) -> dict[str, Any]:
    """The special tokens `apply_chat_template` hands a template (`bos_token`, `eos_token`, ...)."""
    special = getattr(tokenizer, "special_tokens_map", None) or {}
    return {key: value for key, value in special.items() if isinstance(value, str)}
