"""The control plane's bottom layer: service errors, the one clock, the settings as read once,
the API token scopes and which token each supervisor is sent. It imports only the pure core,
`common` and Django's settings."""
