"""Hypothesis strategies for protocol-neutral answers: text, calls, thinking, a finish."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from proxy.protocols.answer import Answer, Finish, Usage
from proxy.testing import call, thinking

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-1000, 1000) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)
json_objects = st.dictionaries(st.text(max_size=6), json_values, max_size=3)
fragments = st.sampled_from([0, 1, 2, 5, 64])  # 0: each text or arguments in one delta


def answers(
    names: list[str], arguments: st.SearchStrategy[Any], *, thoughts: int = 1
) -> st.SearchStrategy[Answer]:
    """Answers calling `names` with `arguments` (dicts are written as JSON), with up to
    `thoughts` thinking blocks, some cut at the token limit."""

    def build(text: str, calls: list[Any], blocks: list[str], finish: Finish | None) -> Answer:
        return Answer(
            text=text or None,
            calls=tuple(call(n, a) for n, a in calls),
            thinking=tuple(thinking(t) for t in blocks),
            finish=finish,
            usage=Usage(12, 7, cached_tokens=3),
            id="prop",
            created=1,
        )

    return st.builds(
        build,
        st.text(max_size=30),
        st.lists(st.tuples(st.sampled_from(names), arguments), max_size=3),
        st.lists(st.text(min_size=1, max_size=20), max_size=thoughts),
        st.sampled_from([None, Finish.LENGTH]),
    )
