"""Clients of OpenAI-compatible inference engines."""

from draftsmith.client.chat import ChatClient, ChatResult, normalize_base_url

__all__ = ["ChatClient", "ChatResult", "normalize_base_url"]
