"""draftsmith: from a prompt dataset and a target LLM to a trained, verified DFlash drafter."""

__version__ = "0.1.0"
