"""One package per wire protocol (`chat/`, `responses/`, `messages/`), pure translation between
its bodies and the turn; `base.py` holds the turn's neutral types and the shared enums, `answer.py`
the protocol-neutral answer the writers take, `constrain.py` each protocol's constrained re-ask by
its `api`, `schema.py` the envelope of every route's request schema."""
