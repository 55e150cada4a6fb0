"""Business writes: the only code that changes state. Every transition is one conditional UPDATE
whose row count is checked; see docs/architecture.md for why each is race-free."""
