"""Declarative fleet layouts: parse, validate (JSON Schema plus semantic rules), export."""
