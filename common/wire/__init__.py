"""The supervisor wire contract as data: one JSON Schema per route's request and response.

The schema files ship inside the package (see pyproject's package-data), so an installed wheel
can validate too. `shape` holds what the supervisor needs at run time (no jsonschema);
`contract` validates bodies against the schemas (the control plane and the tests use it).
"""
