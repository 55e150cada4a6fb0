"""Drivers for domains Haru provisions: SkyPilot and SkyServe through the `sky` CLI
(docs/drivers.md)."""
