"""One adapter per wire protocol, pure translation between its bodies and the turn (`base.py`)."""
