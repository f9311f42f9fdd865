"""One module per dataset family; each returns records as plain dicts and does no I/O at import time."""
