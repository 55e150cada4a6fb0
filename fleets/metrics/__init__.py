"""Every Prometheus series Haru exports, and the `/metrics` view (`registry`)."""
