"""Time to first token of a streamed answer (any of the three protocols), one request at a time
over one connection: bench/drivers.py's `first_token_latencies` in a process of its own (so that
it can be pinned to a CPU).

A blocking socket, no HTTP library: it sends the request, notes when the upstream's first content
(`FIRST_TOKEN` of bench/fake_upstream.py) arrives, then reads the stream to its end before the
next request. Prints one JSON line with percentiles in microseconds.

    python -m bench.ttft --url http://127.0.0.1:9102/v1/chat/completions --body body.json -n 300
"""

from __future__ import annotations

import argparse
import sys

import orjson

from bench.drivers import StreamError, first_token_latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--body", required=True, help="file with the JSON request body")
    parser.add_argument("-n", "--requests", type=int, default=300)
    args = parser.parse_args()
    with open(args.body, "rb") as file:
        body = file.read()
    try:
        result: dict[str, object] = dict(first_token_latencies(args.url, body, args.requests))
    except (StreamError, OSError) as exc:
        result = {"error": str(exc)}
    sys.stdout.write(orjson.dumps(result).decode() + "\n")


if __name__ == "__main__":
    main()
