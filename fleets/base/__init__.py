"""The control plane's bottom layer: service errors, the one clock, the settings as read once,
the API token scopes, which token each supervisor is sent, and the one door to the private
interfaces of Django, DRF and psycopg (`private_apis.py`). It imports only the pure core,
`common` and Django's settings."""
