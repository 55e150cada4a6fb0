"""The Haru Django project: settings, URL routing, ASGI entry point and the Celery app.

The Celery app is loaded with the project (Celery's Django pattern), so a task queued from any
process goes through the broker the settings name, with nothing below importing `haru`.
"""

from haru.celery import app as celery_app

__all__ = ("celery_app",)
