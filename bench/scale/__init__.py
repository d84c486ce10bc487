"""How toolsentry scales across cores: throughput, CPU per request of every role, Redis commands
per request and the sessions' counts, at 1, 2, 4, … workers on the memory, SQLite and Redis
stores, beside the fake upstream alone (`direct`), the aiohttp pass-through and LiteLLM; then
latency at fixed request rates (open loop) against direct at the same rate.

Placement (`taskset`), on the CPUs this process may use: with 8 or more, a quarter for the fake
upstream (one process per CPU on one port, SO_REUSEPORT), an eighth for the load generator, one
for `redis-server`, the rest for the proxy, whose workers go 1, 2, 4, … up to them. With fewer
there is not enough to go round: upstream, load generator and Redis share the first CPU, one
worker has the second to itself, and the largest count takes every CPU (on 2 CPUs: workers 1
and 2, the second sharing a CPU with the rest, which the results file says).

Closed loop, every point: a warm-up, then `--rounds` rounds of `--duration` s of wrk at
`--connections` (256) posting the 7.2 kB chat body of bench/bodies.py; medians over rounds with
min–max. CPU per role from `/proc/<pid>/stat` of each process group (the proxy's workers, the
upstream's processes, redis-server) and wrk's own rusage, before and after each round. Redis
commands per request from `INFO commandstats` (the commands the store's Lua scripts run
included); the commands the proxy itself sends (round trips) from `MONITOR` over
`--monitor-requests` requests one at a time after the rounds. Count check (toolsentry): every
request of the run falls in one session (the body names it in `metadata.session_id`, so the
store does its per-request work without the conversation lookup of a request that names none),
so after each round the session's request count (`GET /v1/sessions/{id}`) must have grown
exactly as the proxy's `toolsentry_requests_total` did, by at least wrk's answered requests and
at most those plus the connections still in flight when wrk stopped.

Open loop (bench/openloop.py, timed from each request's scheduled send): toolsentry on Redis at
the largest worker count (and at 4 workers where there are more), at `--rates` requests a
second; `auto` takes a quarter, a half and four fifths of that point's closed-loop rate (and
10,000/s at 4 workers: the issue's anchor). Direct runs at each rate just before, and the added
p50/p99 are the differences. The generator's own check (its dispatch lag and the requests it
handed over per 50 ms window against the rate) is reported beside.

    python -m bench.scale [--duration 3] [--rounds 3] [--connections 256] [--rates auto]
                          [--stores memory,sqlite,redis] [--quick] [--no-write] [--json FILE]

`--quick` is a smoke run (one second of warm-up and one round of one second a point, the two
smallest worker counts, one rate, 20 requests under MONITOR, no LiteLLM); it writes no results
file. `--json` keeps every figure (tests/bench runs `--quick` with it). Needs `wrk` and
`redis-server` (scripts/system-deps).
"""
