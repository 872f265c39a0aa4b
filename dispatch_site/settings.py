"""Django settings, all read from the environment through dispatch_site.config (see the README's table)."""

from __future__ import annotations

from datetime import timedelta

from celery.schedules import crontab
from kombu import Exchange, Queue

from dispatch_site.config import BASE_DIR, VAR_DIR, load_config
from dispatch_site.worker_command import DEFAULT_QUEUE, QUEUES, WEBHOOKS_QUEUE

CONFIG = load_config()

DEBUG = CONFIG.debug
SECRET_KEY = CONFIG.secret_key
SECRET_KEY_FALLBACKS = list(CONFIG.secret_key_fallbacks)
ALLOWED_HOSTS = list(CONFIG.allowed_hosts)
DATABASES = {"default": CONFIG.database}
REDIS_URL = CONFIG.redis_url
KUBECONFIG = CONFIG.kubeconfig
WORKER_KUBECONFIG_DIR = CONFIG.worker_kubeconfig_dir
KUBE_TIMEOUT_SECONDS = CONFIG.kube_timeout_seconds
# (namespace, name) of the Trainer controller manager's leader-election Lease (TRAINER_LEADER_LEASE).
TRAINER_LEADER_LEASE = CONFIG.trainer_leader_lease
# One connection pool per process, as large as the worker's thread pool (urllib3 would otherwise open, and
# throw away, a new TLS connection for every thread beyond its default of 5 per core).
KUBE_CONNECTION_POOL_SIZE = max(CONFIG.worker_concurrency, 10)

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "knox",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_htmx",
    "dispatch_site",
    "runtimes",
    "jobs",
    "jobs.observability",
    "jobs.usage",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "dispatch_site.middleware.single_valued_query",
]

ROOT_URLCONF = "dispatch_site.urls"
WSGI_APPLICATION = "dispatch_site.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "dispatch_site.roles.roles_context",
            ],
        },
    },
]

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator", "OPTIONS": {"min_length": 12}},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "dashboard:jobs"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
STATICFILES_DIRS = [BASE_DIR / "static"]
# WhiteNoise serves static files from gunicorn too, finding them without collectstatic.
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = False  # htmx reads the token from the page, not the cookie
if not DEBUG:
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_CONTENT_TYPE_NOSNIFF = True
    X_FRAME_OPTIONS = "DENY"
# Behind a TLS-terminating proxy: the header (and value) that proxy sets, e.g. X-Forwarded-Proto=https.
SECURE_PROXY_SSL_HEADER = CONFIG.secure_proxy_ssl_header
SECURE_SSL_REDIRECT = CONFIG.secure_ssl_redirect
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$"]  # probes and scrapers speak plain HTTP
SECURE_HSTS_SECONDS = CONFIG.hsts_seconds
SECURE_HSTS_INCLUDE_SUBDOMAINS = CONFIG.hsts_seconds > 0
SECURE_HSTS_PRELOAD = CONFIG.hsts_seconds > 0

# API tokens: django-rest-knox, stored as digests in dispatch_site.ApiToken.
KNOX_TOKEN_MODEL = "dispatch_site.ApiToken"
# knox's own AuthToken is swapped out for dispatch_site.ApiToken, but knox's migrations would still create its
# table, with a foreign key to auth_user that nothing flushes (the transactional tests' TRUNCATE then fails).
MIGRATION_MODULES = {"knox": None}
REST_KNOX = {
    "TOKEN_MODEL": KNOX_TOKEN_MODEL,
    "TOKEN_TTL": timedelta(days=CONFIG.api_token_ttl_days),
    "AUTH_HEADER_PREFIX": "Token",
}
API_TOKEN_TTL_DAYS = CONFIG.api_token_ttl_days

# Throttles (dispatch_site.throttles) count in Redis through this cache.
CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    "throttle": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": "dispatch-throttle",
        "OPTIONS": {"socket_connect_timeout": 1, "socket_timeout": 1},
    },
}
THROTTLE_RATES = {
    "login-user": CONFIG.login_rate_user,
    "login-address": CONFIG.login_rate_address,
    "api-user": CONFIG.api_rate_user,
}
READYZ_DETAIL_ADDRESSES = CONFIG.readyz_detail_addresses

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "dispatch_site.auth.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "dispatch_site.api.exception_handler",
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
    "DEFAULT_THROTTLE_CLASSES": ["dispatch_site.throttles.ApiUserThrottle"],
}
# The proxies whose X-Forwarded-For entries are believed (dispatch_site.client_address): the client address
# the throttles and the audit log use is REMOTE_ADDR unless the request came through one of them.
TRUSTED_PROXIES = list(CONFIG.trusted_proxies)

SPECTACULAR_SETTINGS = {
    "TITLE": "dispatch API",
    "DESCRIPTION": "Plan, start and supervise Kubeflow Trainer TrainJobs; curate the runtime allow-list.",
    "VERSION": "1",
    # 3.1: JSON Schema 2020-12, which can state the rules on map keys (propertyNames: env names, label keys,
    # resource names) that 3.0 cannot.
    "OAS_VERSION": "3.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    # 400/401/403/404/429/503 from the shared plumbing, documented once (dispatch_site/schema.py).
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "dispatch_site.schema.add_common_responses",
    ],
    # Jobs and sessions both have a `state` field with different choices: name each enum.
    "ENUM_NAME_OVERRIDES": {
        "JobStateEnum": "jobs.models.JobState",
        "SessionStateEnum": "jobs.models.SessionState",
        "RuntimeKindEnum": "runtimes.models.RuntimeKind",
        "WebhookEventTypeEnum": "jobs.observability.payloads.EVENT_TYPES",
    },
}

# Celery: the job record in the database is the source of truth; the broker only carries primary keys.
# What /readyz and `manage.py preflight` check (dispatch_site.health.readiness_checks): name -> dotted path.
READINESS_CHECKS = {
    "database": "dispatch_site.health.check_database",
    "redis": "dispatch_site.health.check_redis",
    "kubernetes": "cluster.health.check_kubernetes",
}
# What /readyz also reports to those who see its details, without counting toward readiness: a missing
# admission guard is a warning to act on, not a reason to take dispatch out of service.
READINESS_ADVISORIES = {
    "guard": "cluster.guard.check_guard",
}

CELERY_BROKER_URL = REDIS_URL
# kombu's Redis transport, fixed so that a Redis restart does not end a worker (dispatch_site.broker).
CELERY_BROKER_TRANSPORT = "dispatch_site.broker:Transport"
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True  # a task is acknowledged after it ran, so a killed worker does not lose it
CELERY_TASK_REJECT_ON_WORKER_LOST = True
# Threads: a start is I/O against the API server (about 0.2 s of waiting for a few ms of Python), so one
# process overlaps many of them; claims, fencing and the lock order make concurrent tasks safe.
CELERY_WORKER_POOL = "threads"
CELERY_WORKER_CONCURRENCY = CONFIG.worker_concurrency
# A few messages per thread wait in the worker: with one, a thread that finished idled until the consumer
# (one thread, competing for the GIL with the pool) fetched the next from Redis (py-spy during a burst: a
# quarter of the pool's samples were idle threads). A message a killed worker held is not lost: the stale
# sweep starts (or deletes) again what was accepted and not done.
CELERY_WORKER_PREFETCH_MULTIPLIER = 4
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# A broker message is a request, never an order (jobs.submission.cancel.delete_intended): the tasks check the
# database. Celery's remote control commands (shutdown, pool_shrink, revoke, add_consumer, ...) are broadcast
# over the same broker and obeyed as they come, so the workers do not listen for them unless asked
# (WORKER_REMOTE_CONTROL; the start-throughput bench pings its worker).
CELERY_WORKER_ENABLE_REMOTE_CONTROL = CONFIG.worker_remote_control
# Celery's Django fixup closes every database connection around every task unless this is set; it then closes
# them every 2 x this many tasks. Connections are kept and checked per task instead (dispatch_site.celery).
CELERY_DB_REUSE_MAX = 1_000_000
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": 3600,
    "socket_timeout": 5,
    "socket_connect_timeout": 5,
}
# Webhook deliveries on a queue of their own (dispatch_site.worker_command); every other task on the default.
CELERY_TASK_QUEUES = [Queue(name, Exchange(name), routing_key=name) for name in QUEUES]
CELERY_TASK_DEFAULT_QUEUE = DEFAULT_QUEUE
CELERY_TASK_ROUTES = {"jobs.observability.tasks.webhook_deliver": {"queue": WEBHOOKS_QUEUE}}
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TIMEZONE = "UTC"
CELERY_BEAT_SCHEDULE = {
    "recheck-runtimes": {"task": "runtimes.tasks.runtimes_recheck", "schedule": crontab(minute="*/5")},
    "resubmit-stale-executions": {
        "task": "jobs.submission.tasks.executions_resubmit_stale",
        "schedule": 60.0,
    },
    # MultiKueue: what a lost worker still runs for ended attempts, once back (jobs.submission.leftovers).
    "worker-leftovers-sweep": {
        "task": "jobs.submission.tasks.worker_leftovers_sweep",
        "schedule": 120.0,
        "options": {"expires": 120.0},
    },
    # MultiKueue: what a lost worker still holds of the sessions that ended while it was lost, once back.
    "session-leftovers-sweep": {
        "task": "jobs.sessions.tasks.session_leftovers_sweep",
        "schedule": 120.0,
        "options": {"expires": 120.0},
    },
    # Sessions whose watcher message was lost, closing sessions, expired sessions (jobs.sessions).
    "sessions-sweep": {
        "task": "jobs.sessions.tasks.sessions_sweep",
        "schedule": 30.0,
        "options": {"expires": 30.0},
    },
    "supervise": {
        "task": "jobs.supervision.tasks.supervise",
        "schedule": float(CONFIG.supervisor_interval_seconds),
        # A cycle older than its interval is superseded by the next one: never let them pile up.
        "options": {"expires": float(CONFIG.supervisor_interval_seconds)},
    },
}
SUPERVISOR_INTERVAL_SECONDS = CONFIG.supervisor_interval_seconds
# Observability (jobs.observability, dispatch_site.metrics): README "Observability".
CELERY_BEAT_SCHEDULE["webhooks-sweep"] = {
    "task": "jobs.observability.tasks.webhooks_sweep",
    "schedule": float(CONFIG.webhook_sweep_seconds),
    "options": {"expires": float(CONFIG.webhook_sweep_seconds)},
}
CELERY_BEAT_SCHEDULE["usage-rollup"] = {  # jobs.usage: ended attempts into the daily rollup
    "task": "jobs.usage.tasks.usage_rollup",
    "schedule": 30.0,
    "options": {"expires": 30.0},
}
HISTORY_RETENTION_DAYS = CONFIG.history_retention_days
CELERY_BEAT_SCHEDULE["history-prune"] = {  # jobs.usage: old attempts' details, once the rollup counted them
    "task": "jobs.usage.tasks.history_prune",
    "schedule": crontab(minute="17"),
    "options": {"expires": 3000.0},
}
CELERY_BEAT_SCHEDULE["job-counts-compact"] = {
    "task": "jobs.observability.tasks.job_counts_compact",
    "schedule": 30.0,
    "options": {"expires": 30.0},
}
METRICS_TOKEN = CONFIG.metrics_token
WEBHOOK_RETRY_SCHEDULE = CONFIG.webhook_retry_schedule
# The whole budget of one attempt, not a per-read timeout (jobs.observability.webhook_send).
WEBHOOK_TIMEOUT_SECONDS = CONFIG.webhook_timeout_seconds
WEBHOOK_ENDPOINTS_PER_USER = CONFIG.webhook_endpoints_per_user
WEBHOOK_CA_BUNDLE = CONFIG.webhook_ca_bundle
WEBHOOK_ALLOW_HTTP = CONFIG.webhook_allow_http
WEBHOOK_ALLOW_PRIVATE_ADDRESSES = CONFIG.webhook_allow_private_addresses
WEBHOOK_SECRET_GRACE_SECONDS = CONFIG.webhook_secret_grace_seconds
# How long a supervision cycle holds its lease before it must renew it (a thread renews it while it runs).
SUPERVISOR_LEASE_SECONDS = max(3 * CONFIG.supervisor_interval_seconds, 30)
NO_CAPACITY_AFTER_SECONDS = CONFIG.no_capacity_after_seconds
STUCK_AFTER_SECONDS = CONFIG.stuck_after_seconds
INADMISSIBLE_AFTER_SECONDS = CONFIG.inadmissible_after_seconds
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": CONFIG.log_level},
    "loggers": {"kubernetes": {"level": "WARNING"}, "urllib3": {"level": "WARNING"}},
}

# How long an Idempotency-Key is remembered for POST /api/v1/jobs.
IDEMPOTENCY_WINDOW_SECONDS = 24 * 3600

# Interactive sessions (jobs.sessions): how long the trainer pod may take to run when the request names no
# timeout; how long one command may run; how much of its output an answer carries; how long close waits for
# the pods to go before it records a warning.
SESSION_OPEN_TIMEOUT_SECONDS = 300
SESSION_OPEN_TIMEOUT_MAX_SECONDS = 3600
SESSION_EXEC_TIMEOUT_SECONDS = 60
SESSION_EXEC_TIMEOUT_MAX_SECONDS = 600
SESSION_EXEC_MAX_OUTPUT_BYTES = 1024 * 1024
SESSION_CLOSE_TIMEOUT_SECONDS = 180
# Long requests (exec, ?wait=, logs?follow=true): dispatch_site.longrequests. The key prefix lets tests count
# apart.
LONG_REQUESTS_PER_PROCESS = CONFIG.long_requests_per_process
LONG_REQUESTS_PER_USER = CONFIG.long_requests_per_user
LONG_REQUESTS_KEY_PREFIX = "v1"
# How long a session may live from its open; the sweep closes it then, and exec is refused after it.
SESSION_MAX_LIFETIME_SECONDS = CONFIG.session_max_lifetime_seconds
# A failed session is closed this long after it failed (its TrainJob, pods, quota and GPUs released).
SESSION_FAILED_GRACE_SECONDS = CONFIG.session_failed_grace_seconds
