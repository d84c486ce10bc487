"""The RedisStore's conversations by history (`SessionStore.track_conversation`): one list per
digest, `{prefix}conversation:{digest}`, of the conversations remembered under it, oldest first,
each entry `"{at}|{session}"`; one Lua script applies the rule of
`proxy.session.history.follow` to them in one round trip. Every list written gets a Redis TTL
of the session TTL, and an entry is live while `at + ttl > now` (the `now` the call is given,
as for every record of the store)."""

from __future__ import annotations

from collections.abc import Sequence

from proxy.session.history import MAX_PER_TIP, History
from proxy.session.redis_connections import Script

# KEYS: the tip's list, then the prefixes' lists, longest first.
# ARGV: now, ttl (seconds), ttl in milliseconds, the new session, the entries a list keeps.
# Returns the session.
_TRACK_LUA = """
local now_s, ttl, ttl_ms, new, cap = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4], tonumber(ARGV[5])
local now = tonumber(now_s)
-- The first live entry of a list (expired ones before it dropped), popped when `take`.
local function first(key, take)
  while true do
    local entry = redis.call('LINDEX', key, 0)
    if not entry then return nil end
    local bar = string.find(entry, '|', 1, true)
    if tonumber(string.sub(entry, 1, bar - 1)) + ttl > now then
      if take then redis.call('LPOP', key) end
      return string.sub(entry, bar + 1)
    end
    redis.call('LPOP', key)
  end
end
local function put(session)
  redis.call('RPUSH', KEYS[1], now_s .. '|' .. session)
  redis.call('LTRIM', KEYS[1], -cap, -1)
  redis.call('PEXPIRE', KEYS[1], ttl_ms)
  return session
end
for i = 2, #KEYS do
  local session = first(KEYS[i], true)
  if session then return put(session) end
end
local repeated = first(KEYS[1], false)
if repeated then
  redis.call('LSET', KEYS[1], 0, now_s .. '|' .. repeated)
  redis.call('PEXPIRE', KEYS[1], ttl_ms)
  return repeated
end
return put(new)
"""

TRACK_CONVERSATION = Script(_TRACK_LUA)


def track_call(
    prefix: str, history: History, new_session: str, *, now: float, ttl: float, ttl_ms: int
) -> tuple[list[str], Sequence[str]]:
    """The keys and arguments of `TRACK_CONVERSATION` for `history`, under the store's key
    `prefix`."""
    keys = [prefix + "conversation:" + digest for digest in (history.tip, *history.prefixes)]
    args = (repr(float(now)), repr(float(ttl)), str(ttl_ms), new_session, str(MAX_PER_TIP))
    return keys, args
