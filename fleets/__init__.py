"""The control plane: fleets, domains, slots, operations and everything that moves them."""
