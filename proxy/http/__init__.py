"""The HTTP edge: replies, keys, body reading, the turn routes' dispatch, the other routes and
the raw pass-through."""
