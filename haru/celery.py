"""The Celery app: broker on REDIS_URL; beat drives reconcile ticks in production."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "haru.settings")

app = Celery("haru")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
