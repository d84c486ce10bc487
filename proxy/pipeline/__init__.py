"""The protocol-neutral turn (`turn.py`) and its two drivers, plain (`plain.py`) and streamed
(`stream.py`); a wire protocol plugs in through the adapter of `proxy.protocols.base`."""
