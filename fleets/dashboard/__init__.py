"""The operator dashboard: server-rendered pages, live fragments, and the action buttons."""
