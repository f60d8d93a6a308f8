"""A synthetic, structured chat corpus the tiny target learns from.

Every task has a deterministic answer derived from the prompt, with a short reasoning trace, so a
tiny target learns patterns that a drafter can then predict (acceptance length well above 1).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Iterator
from typing import Any

WORDS = (
    "apple river stone cloud garden silver window yellow planet orange forest candle "
    "mirror rocket ocean pencil butter winter summer castle dragon bridge market violet "
    "thunder lemon jacket pillow rabbit tiger harbor meadow copper marble signal anchor "
    "basket cactus dinner engine falcon ginger hollow island jungle kettle ladder magnet "
    "needle oyster parrot quartz ribbon saddle tunnel velvet walnut zipper"
).split()

SYSTEM_PROMPTS = (
    "You are a helpful assistant.",
    "You are a careful assistant. Answer briefly.",
    "You answer puzzles step by step.",
)


def _reverse(rng: random.Random) -> tuple[str, str, str]:
    word = rng.choice(WORDS)
    backwards = word[::-1]
    return (
        f"Reverse the word {word}.",
        f"The word is {word}. Its letters are {' '.join(word)}. "
        f"Read backwards they are {' '.join(backwards)}.",
        f"The reversed word is {backwards}.",
    )


def _count(rng: random.Random) -> tuple[str, str, str]:
    start = rng.randint(1, 30)
    stop = start + rng.randint(3, 9)
    numbers = ", ".join(str(n) for n in range(start, stop + 1))
    return (
        f"Count from {start} to {stop}.",
        f"I start at {start} and add one each step until I reach {stop}.",
        f"Here is the count: {numbers}.",
    )


def _spell(rng: random.Random) -> tuple[str, str, str]:
    word = rng.choice(WORDS)
    return (
        f"Spell {word} letter by letter.",
        f"The word {word} has {len(word)} letters. I write them with dashes between them.",
        f"{word} is spelled {'-'.join(word)}.",
    )


def _repeat(rng: random.Random) -> tuple[str, str, str]:
    word = rng.choice(WORDS)
    times = rng.randint(2, 5)
    return (
        f"Repeat {word} {times} times.",
        f"I need to write {word} exactly {times} times, separated by spaces.",
        " ".join([word] * times),
    )


def _upper(rng: random.Random) -> tuple[str, str, str]:
    chosen = rng.sample(WORDS, 2)
    phrase = " ".join(chosen)
    return (
        f"Write {phrase} in capital letters.",
        f"The phrase is {phrase}. In capital letters every letter becomes upper case.",
        f"In capital letters: {phrase.upper()}.",
    )


def _sort(rng: random.Random) -> tuple[str, str, str]:
    numbers = rng.sample(range(1, 50), rng.randint(3, 6))
    listed = " ".join(str(n) for n in numbers)
    ordered = " ".join(str(n) for n in sorted(numbers))
    return (
        f"Sort these numbers: {listed}.",
        f"The numbers are {listed}. The smallest is {min(numbers)} and the largest is "
        f"{max(numbers)}.",
        f"In order: {ordered}.",
    )


TASKS: tuple[Callable[[random.Random], tuple[str, str, str]], ...] = (
    _reverse,
    _count,
    _spell,
    _repeat,
    _upper,
    _sort,
)


def stable_id(prefix: str, index: int, seed: int) -> str:
    digest = hashlib.sha1(f"{prefix}:{seed}:{index}".encode()).hexdigest()[:12]
    return f"{prefix}-{index:06d}-{digest}"


def synthetic_conversations(
    count: int, seed: int = 0, multi_turn_share: float = 0.15, system_share: float = 0.3
) -> Iterator[dict[str, Any]]:
    """Yield OpenAI-style conversations whose last assistant turn carries `reasoning_content`.

    Some conversations are multi-turn (an earlier user/assistant exchange), some have a system
    prompt, so chat templates are exercised as they are on real data.
    """
    rng = random.Random(seed)
    for index in range(count):
        messages: list[dict[str, Any]] = []
        if rng.random() < system_share:
            messages.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
        if rng.random() < multi_turn_share:
            prompt, reasoning, answer = rng.choice(TASKS)(rng)
            messages.append({"role": "user", "content": prompt})
            messages.append(
                {"role": "assistant", "content": answer, "reasoning_content": reasoning}
            )
        prompt, reasoning, answer = rng.choice(TASKS)(rng)
        messages.append({"role": "user", "content": prompt})
        messages.append({"role": "assistant", "content": answer, "reasoning_content": reasoning})
        yield {"id": stable_id("syn", index, seed), "messages": messages}


def synthetic_prompts(count: int, seed: int = 1) -> Iterator[dict[str, Any]]:
    """Yield prompt-only rows (the conversation without its final assistant turn).

    This is what a user brings to `generate`: prompts whose completions must be regenerated.
    """
    for row in synthetic_conversations(count, seed=seed):
        yield {"id": row["id"], "messages": row["messages"][:-1]}
