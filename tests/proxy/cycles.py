"""What only the cycle collector would free, found with it off: a test makes its requests inside
`collector_off()`, then `left_in_cycles()` names what a collection would free (the proxy's own
objects; large buffers too, when asked)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_off() -> Iterator[None]:
    """The cycle collector off inside the block (what the block leaves in cycles stays findable)."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.set_debug(0)
        gc.enable()


def left_in_cycles(*, buffers_from: int | None = None) -> list[str]:
    """The sorted type names of what only the collector would free: objects of the proxy's own
    modules and, with `buffers_from`, bytes, bytearrays and strings of that length or longer."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    gc.collect()
    found = sorted(
        {
            type(o).__qualname__
            for o in gc.garbage
            if type(o).__module__.startswith("proxy.")
            or (
                buffers_from is not None
                and isinstance(o, bytes | bytearray | str)
                and len(o) >= buffers_from
            )
        }
    )
    gc.garbage.clear()
    gc.set_debug(0)
    return found
