"""reflex-ipc: cold-start-first LLM inference over JSON lines."""

__version__ = "0.1.0"
