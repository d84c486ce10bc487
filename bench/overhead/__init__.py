"""bench.overhead, split by concept: `targets` (what is started), `measure` (one run), `report`
(tables and goals); `python -m bench.overhead` is `__main__`."""
