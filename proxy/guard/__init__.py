"""The pure core of the proxy: tool-call validation, leak detection and repair messages.

Nothing here does I/O, reads a clock or imports a web framework, so the same code classifies
failures online (the proxy) and offline (evalkit's analysis).
"""

from proxy.guard.channels import Channel, Violation

__all__ = ["Channel", "Violation"]
