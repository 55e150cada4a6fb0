"""The live layer: WebSocket consumers that relay a fleet's broadcasts to staff browsers."""
