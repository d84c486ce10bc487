"""toolsentry: an OpenAI-compatible proxy that validates, repairs and budgets every tool call."""

__version__ = "0.1.0"
