"""The Haru Django project: settings, URL routing, ASGI entry point and the Celery app."""
