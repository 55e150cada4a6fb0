"""The REST API (DRF): thin views that parse, call one service or selector, and render."""
