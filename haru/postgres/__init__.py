"""Haru's PostgreSQL backend: Django's own, with a deadline on every database wait of a web
request (`deadline.py`), so a frozen database answers 503 instead of holding the request."""
