"""The fleets schema as of 4 December 2026: migrations 0001 to 0014, squashed.

Generated from the models by makemigrations; its schema on PostgreSQL is the one the fourteen
gave, column order aside (pg_dump --schema-only of both, sorted, compared equal). The data
steps of 0002 and 0005 (filling new columns from old rows) are not here: this migration runs
only on an empty database. A database that applied all fourteen counts it as applied; one part
of the way through must be upgraded from an older commit first (fleets/checks.py, haru.E003).
"""

import django.db.models.deletion
import fleets.core.model_health
import fleets.core.states
import uuid
from django.db import migrations, models


class Migration(migrations.Migration):

    initial = True

    replaces = [
        ("fleets", "0001_initial"),
        ("fleets", "0002_scheduling_columns"),
        ("fleets", "0003_gpu_plan"),
        ("fleets", "0004_domain_driver"),
        ("fleets", "0005_operation_history_survives_prune"),
        ("fleets", "0006_operation_cleanup"),
        ("fleets", "0007_tick_lease"),
        ("fleets", "0008_golden_baselines"),
        ("fleets", "0009_drills"),
        ("fleets", "0010_model_health"),
        ("fleets", "0011_drill_modes_detection_baseline_probe"),
        ("fleets", "0012_binding_engine_version"),
        ("fleets", "0013_operation_source_state"),
        ("fleets", "0014_domain_provider_from_driver_registry"),
    ]

    dependencies = [
    ]

    operations = [
        migrations.CreateModel(
            name='Domain',
            fields=[
                ('id', models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                ('slug', models.CharField(max_length=63)),
                ('display_name', models.CharField(blank=True, default='', max_length=200)),
                ('provider', models.CharField(choices=[('static', 'static'), ('script', 'script'), ('skypilot', 'skypilot'), ('skyserve', 'skyserve')], default=fleets.core.states.Provider['STATIC'], max_length=16)),
                ('placement', models.JSONField(blank=True, default=dict)),
                ('supervisor_url', models.URLField(blank=True, default='', max_length=500)),
                ('serving_base_url', models.URLField(blank=True, default='', max_length=500)),
                ('priority', models.PositiveIntegerField(default=100)),
                ('state', models.CharField(choices=[('provisioning', 'provisioning'), ('ready', 'ready'), ('degraded', 'degraded'), ('failed', 'failed'), ('stopping', 'stopping'), ('stopped', 'stopped')], default=fleets.core.states.DomainState['PROVISIONING'], editable=False, max_length=16)),
                ('last_seen_at', models.DateTimeField(blank=True, editable=False, null=True)),
                ('state_updated_at', models.DateTimeField(editable=False)),
                ('gpu_layout', models.JSONField(blank=True, default=dict)),
                ('heartbeat_checked_at', models.DateTimeField(blank=True, editable=False, null=True)),
                ('heartbeat_failing_since', models.DateTimeField(blank=True, editable=False, null=True)),
                ('gpus_read_at', models.DateTimeField(blank=True, editable=False, null=True)),
                ('last_report', models.JSONField(blank=True, default=dict, editable=False)),
                ('driver', models.JSONField(blank=True, default=dict)),
                ('driver_status', models.JSONField(blank=True, default=dict, editable=False)),
                ('provision_attempt', models.PositiveIntegerField(default=0, editable=False)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
            ],
            options={
                'ordering': ['fleet', 'priority', 'slug'],
            },
        ),
        migrations.CreateModel(
            name='FleetArchive',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('fleet_id', models.UUIDField()),
                ('slug', models.CharField(max_length=63)),
                ('deleted_at', models.DateTimeField()),
                ('deleted_by', models.CharField(blank=True, default='', max_length=150)),
                ('layout', models.JSONField(default=dict)),
                ('operations', models.JSONField(default=list)),
                ('events', models.JSONField(default=list)),
            ],
            options={
                'ordering': ['-deleted_at'],
            },
        ),
        migrations.CreateModel(
            name='Lease',
            fields=[
                ('name', models.CharField(max_length=100, primary_key=True, serialize=False)),
                ('holder', models.CharField(blank=True, default='', max_length=100)),
                ('expires_at', models.DateTimeField(blank=True, null=True)),
                ('acquired_at', models.DateTimeField(blank=True, null=True)),
            ],
        ),
        migrations.CreateModel(
            name='Fleet',
            fields=[
                ('id', models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                ('slug', models.CharField(max_length=63, unique=True)),
                ('display_name', models.CharField(blank=True, default='', max_length=200)),
                ('policy', models.JSONField(blank=True, default=dict)),
                ('route_revision', models.BigIntegerField(default=1, editable=False)),
                ('no_standby_reported_at', models.DateTimeField(blank=True, editable=False, null=True)),
                ('drill_interval_minutes', models.PositiveIntegerField(blank=True, help_text='Run a drill this often (minutes); empty: never.', null=True)),
                ('drill_window_start', models.TimeField(blank=True, help_text='Start of the daily drill window (UTC).', null=True)),
                ('drill_window_end', models.TimeField(blank=True, help_text='End of the daily drill window (UTC).', null=True)),
                ('baseline_probe_at', models.DateTimeField(blank=True, editable=False, null=True)),
                ('drill_mode', models.CharField(choices=[('check', 'check'), ('round_trip', 'round_trip')], db_default='check', default=fleets.core.states.DrillMode['CHECK'], help_text='check: wake and probe the standby, routing never moves; round_trip: promote the standby and promote the active back (routing moves twice; needs autoFailover).', max_length=16)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('updated_at', models.DateTimeField(auto_now=True)),
                ('active_domain', models.ForeignKey(blank=True, editable=False, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='fleets.domain')),
            ],
            options={
                'ordering': ['slug'],
            },
        ),
        migrations.AddField(
            model_name='domain',
            name='fleet',
            field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='domains', to='fleets.fleet'),
        ),
        migrations.CreateModel(
            name='GoldenBaseline',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('model_name', models.CharField(max_length=200)),
                ('adapter', models.CharField(blank=True, default='', max_length=200)),
                ('profile_fingerprint', models.CharField(max_length=64)),
                ('engine_version', models.CharField(blank=True, default='', max_length=64)),
                ('request_fingerprint', models.CharField(max_length=64)),
                ('answer_sha256', models.CharField(max_length=64)),
                ('answer', models.TextField(blank=True, default='')),
                ('reason', models.CharField(max_length=32)),
                ('recorded_by', models.CharField(blank=True, default='', max_length=150)),
                ('recorded_at', models.DateTimeField()),
                ('domain', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='fleets.domain')),
                ('fleet', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='baselines', to='fleets.fleet')),
            ],
            options={
                'ordering': ['fleet', 'model_name', 'adapter', '-recorded_at'],
            },
        ),
        migrations.CreateModel(
            name='Operation',
            fields=[
                ('id', models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                ('kind', models.CharField(choices=[('promote', 'promote'), ('demote', 'demote'), ('drill', 'drill')], max_length=16)),
                ('state', models.CharField(choices=[('pending', 'pending'), ('running', 'running'), ('succeeded', 'succeeded'), ('failed', 'failed'), ('cancelled', 'cancelled')], default=fleets.core.states.OperationState['PENDING'], max_length=16)),
                ('target_domain_slug', models.CharField(blank=True, db_default='', default='', max_length=63)),
                ('current_step', models.CharField(blank=True, default='', max_length=32)),
                ('step_started_at', models.DateTimeField(blank=True, null=True)),
                ('routing_committed', models.BooleanField(default=False)),
                ('error', models.JSONField(blank=True, null=True)),
                ('cleanup', models.CharField(blank=True, choices=[('', ''), ('pending', 'pending'), ('done', 'done'), ('incomplete', 'incomplete'), ('skipped', 'skipped')], db_default='', default='', max_length=16)),
                ('cleanup_lease_until', models.DateTimeField(blank=True, null=True)),
                ('reason', models.CharField(blank=True, default='manual', max_length=64)),
                ('requested_by', models.CharField(blank=True, default='', max_length=150)),
                ('detected_at', models.DateTimeField(blank=True, null=True)),
                ('source_seen_at', models.DateTimeField(blank=True, null=True)),
                ('source_state', models.CharField(blank=True, db_default='', default='', max_length=16)),
                ('drill_mode', models.CharField(blank=True, db_default='', default='', max_length=16)),
                ('created_at', models.DateTimeField()),
                ('started_at', models.DateTimeField(blank=True, null=True)),
                ('finished_at', models.DateTimeField(blank=True, null=True)),
                ('fleet', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='operations', to='fleets.fleet')),
                ('source_domain', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='fleets.domain')),
                ('target_domain', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='fleets.domain')),
            ],
            options={
                'ordering': ['-created_at'],
            },
        ),
        migrations.CreateModel(
            name='Event',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('kind', models.CharField(max_length=64)),
                ('actor', models.CharField(blank=True, default='', max_length=150)),
                ('step', models.CharField(blank=True, default='', max_length=32)),
                ('duration_ms', models.IntegerField(blank=True, null=True)),
                ('data', models.JSONField(blank=True, default=dict)),
                ('created_at', models.DateTimeField()),
                ('domain', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='fleets.domain')),
                ('fleet', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='events', to='fleets.fleet')),
                ('operation', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='events', to='fleets.operation')),
            ],
            options={
                'ordering': ['-id'],
            },
        ),
        migrations.CreateModel(
            name='Slot',
            fields=[
                ('id', models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                ('gpu_index', models.IntegerField()),
                ('kind', models.CharField(choices=[('inference', 'inference'), ('training', 'training')], max_length=16)),
                ('state', models.CharField(editable=False, max_length=16)),
                ('spec', models.JSONField(blank=True, default=dict)),
                ('gpu_indices', models.JSONField(blank=True, default=list)),
                ('mig_instance', models.CharField(blank=True, default='', max_length=64)),
                ('allocation', models.JSONField(blank=True, default=dict)),
                ('pids', models.JSONField(blank=True, default=list, editable=False)),
                ('state_updated_at', models.DateTimeField(editable=False)),
                ('domain', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='slots', to='fleets.domain')),
            ],
            options={
                'ordering': ['domain', 'gpu_index', 'kind'],
            },
        ),
        migrations.CreateModel(
            name='ModelBinding',
            fields=[
                ('id', models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                ('name', models.CharField(max_length=200)),
                ('serving_url', models.URLField(max_length=500)),
                ('profile', models.JSONField(blank=True, default=dict)),
                ('memory', models.JSONField(blank=True, default=dict)),
                ('golden', models.JSONField(blank=True, db_default={}, default=dict)),
                ('health', models.CharField(choices=[('up', 'up'), ('down', 'down'), ('unknown', 'unknown')], default=fleets.core.model_health.ServerHealth['UNKNOWN'], editable=False, max_length=8)),
                ('health_at', models.DateTimeField(blank=True, editable=False, null=True)),
                ('serving_seen_at', models.DateTimeField(blank=True, editable=False, null=True)),
                ('engine_version', models.CharField(blank=True, db_default='', default='', editable=False, max_length=64)),
                ('engine_version_at', models.DateTimeField(blank=True, editable=False, null=True)),
                ('domain', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='bindings', to='fleets.domain')),
                ('slot', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='bindings', to='fleets.slot')),
            ],
            options={
                'ordering': ['domain', 'name'],
            },
        ),
        migrations.AddConstraint(
            model_name='fleet',
            constraint=models.CheckConstraint(condition=models.Q(('slug__regex', '^(?=.{1,63}$)[a-z0-9]+(-[a-z0-9]+)*$')), name='fleet_slug_valid'),
        ),
        migrations.AddConstraint(
            model_name='fleet',
            constraint=models.CheckConstraint(condition=models.Q(('route_revision__gt', 0)), name='fleet_route_revision_positive'),
        ),
        migrations.AddConstraint(
            model_name='domain',
            constraint=models.UniqueConstraint(fields=('fleet', 'slug'), name='domain_slug_unique_in_fleet'),
        ),
        migrations.AddConstraint(
            model_name='domain',
            constraint=models.CheckConstraint(condition=models.Q(('slug__regex', '^(?=.{1,63}$)[a-z0-9]+(-[a-z0-9]+)*$')), name='domain_slug_valid'),
        ),
        migrations.AddConstraint(
            model_name='domain',
            constraint=models.CheckConstraint(condition=models.Q(('state__in', ['provisioning', 'ready', 'degraded', 'failed', 'stopping', 'stopped'])), name='domain_state_valid'),
        ),
        migrations.AddConstraint(
            model_name='domain',
            constraint=models.CheckConstraint(condition=models.Q(('provider__in', ('static', 'script', 'skypilot', 'skyserve'))), name='domain_provider_valid'),
        ),
        migrations.AddConstraint(
            model_name='goldenbaseline',
            constraint=models.UniqueConstraint(fields=('fleet', 'model_name', 'adapter', 'profile_fingerprint', 'engine_version', 'request_fingerprint'), name='golden_baseline_one_per_key'),
        ),
        migrations.AddIndex(
            model_name='operation',
            index=models.Index(fields=['fleet', '-created_at'], name='operation_fleet_recent'),
        ),
        migrations.AddConstraint(
            model_name='operation',
            constraint=models.UniqueConstraint(condition=models.Q(('state__in', [fleets.core.states.OperationState['PENDING'], fleets.core.states.OperationState['RUNNING']])), fields=('fleet',), name='uq_operation_one_inflight_per_fleet'),
        ),
        migrations.AddConstraint(
            model_name='operation',
            constraint=models.CheckConstraint(condition=models.Q(('state__in', ['pending', 'running', 'succeeded', 'failed', 'cancelled'])), name='operation_state_valid'),
        ),
        migrations.AddConstraint(
            model_name='operation',
            constraint=models.CheckConstraint(condition=models.Q(('kind__in', ['promote', 'demote', 'drill'])), name='operation_kind_valid'),
        ),
        migrations.AddIndex(
            model_name='event',
            index=models.Index(fields=['fleet', '-id'], name='event_fleet_recent'),
        ),
        migrations.AddConstraint(
            model_name='slot',
            constraint=models.UniqueConstraint(fields=('domain', 'gpu_index', 'kind'), name='slot_unique_gpu_kind'),
        ),
        migrations.AddConstraint(
            model_name='slot',
            constraint=models.CheckConstraint(condition=models.Q(('gpu_index__gte', 0)), name='slot_gpu_index_nonneg'),
        ),
        migrations.AddConstraint(
            model_name='slot',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('kind', fleets.core.states.SlotKind['INFERENCE']), ('state__in', ['starting', 'serving', 'sleeping', 'waking', 'probing', 'failed', 'stopped'])), models.Q(('kind', fleets.core.states.SlotKind['TRAINING']), ('state__in', ['idle', 'training', 'stopping', 'failed', 'stopped'])), _connector='OR'), name='slot_kind_state_valid'),
        ),
        migrations.AddConstraint(
            model_name='modelbinding',
            constraint=models.UniqueConstraint(fields=('domain', 'name'), name='binding_name_unique_in_domain'),
        ),
        migrations.AddConstraint(
            model_name='modelbinding',
            constraint=models.CheckConstraint(condition=models.Q(('name__regex', '^[^A-Z\\s]+$')), name='binding_name_lowercase'),
        ),
    ]
