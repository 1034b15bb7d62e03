"""oomguard's one vocabulary: every name that crosses a process or reaches a metric label.

A nanny and a scheduler of the same release must spell an RPC the same way; a Prometheus
label set must hold every value the code passes. Each name is defined here once and
imported where it is used, and each label set is derived from the names, so that a new
guard site or reject reason cannot be forgotten by the metric that counts it.
"""

from __future__ import annotations

# ----------------------------------------------------------------------------- plugins
SCHEDULER_PLUGIN = "oomguard"
NANNY_PLUGIN = "oomguard-nanny"
WORKER_PLUGIN = "oomguard-worker"

# ------------------------------------------------------------- scheduler RPC handlers
#: A nanny's death report (msgpack bytes); without it the nanny falls back to log_event.
REPORT_HANDLER = "oomguard_death_report"
#: "This worker ended with status 0, requested or not": decided at once.
CLEAN_EXIT_HANDLER = "oomguard_clean_exit"
#: This nanny runs its worker without oomguard (on-setup-error: warn).
UNGUARDED_HANDLER = "oomguard_unguarded"
#: History queries from `oomguard.Failures` and `oomguard report`.
QUERY_HANDLER = "oomguard_query"
#: A person's resolve of a signature (`Failures.resolve`, `oomguard report --resolve`).
RESOLVE_HANDLER = "oomguard_resolve"

# ------------------------------------------------------------------ Dask event topics
DEATH_TOPIC = "oomguard-death"
ADMISSION_TOPIC = "oomguard-admission"
STARTUP_TOPIC = "oomguard-startup"
#: A worker's hostname, sent once by its worker plugin: one name per machine in events.
HOST_TOPIC = "oomguard-host"
#: The HOST_TOPIC field by which a worker plugin says it can run a task alone
#: (`RUN_ALONE_ANNOTATION`): its worker may then be chosen for a suspect's retry.
RUNS_ALONE_FIELD = "runs-alone"
#: The HOST_TOPIC field with the environment a worker started with (`_death.record`'s
#: `Environment`, on the wire): the scheduler counts the cluster's workers by it.
ENVIRONMENT_FIELD = "environment"
#: The activity name of an admission wait on Dask's Fine Performance Metrics page.
ADMISSION_WAIT_METRIC = "oomguard-admission-wait"

# ------------------------------------------------------------------- task annotations
#: ``dask.annotate(oomguard_pipeline="etl")``: the run a task belongs to.
PIPELINE_ANNOTATION = "oomguard_pipeline"
#: ``dask.annotate(oomguard_memory=<bytes>)``, as `oomguard.memory(...)` sets it.
MEMORY_ANNOTATION = "oomguard_memory"
#: Set by the scheduler plugin on a suspect retried alone after a shared memory kill (the
#: compute-task message carries it): its worker starts it once the tasks running there have
#: ended, and no other task until it ends, for at most this many seconds.
RUN_ALONE_ANNOTATION = "oomguard_alone"

# ----------------------------------------------------------------------------- cgroups
#: The prefix of oomguard's own per-worker memory groups.
WORKER_GROUP_PREFIX = "oomguard-worker-"

# ------------------------------------------------------------ rejected death reports
#: `ReportError.reason` values from the report validator.
VALIDATION_REASONS = frozenset(
    {
        "not_a_mapping",
        "schema_version",
        "missing_field",
        "wrong_type",
        "too_large",
        "too_deep",
        "bad_value",
        "pickled",
        "undecodable",
    }
)
#: Refused before validation: the intake was full.
OVERFLOW = "overflow"
#: Refused: the worker already has a report.
DUPLICATE = "duplicate"
#: Refused: not sent by the worker's registered nanny.
UNKNOWN_SENDER = "unknown_sender"
#: Refused: the worker never registered with the scheduler, or registered without a nanny.
UNREGISTERED = "unregistered"
#: Refused: the report names another nanny than the one its worker registered with.
WRONG_NANNY = "wrong_nanny"
#: The label set of ``oomguard_reports_rejected_total{reason}``.
REJECT_REASONS = VALIDATION_REASONS | {
    OVERFLOW,
    DUPLICATE,
    UNKNOWN_SENDER,
    UNREGISTERED,
    WRONG_NANNY,
}

# -------------------------------------------------------------- the PostgreSQL history
#: What a row the history refused and the shipper set aside was: the label set of
#: ``oomguard_history_set_aside_total{kind}``.
SET_ASIDE_KINDS = ("event", "run", "example", "delete")

# ------------------------------------------------------------------------ guard sites
#: Where the scheduler side catches its own errors (``guard("site")``): the label set of
#: ``oomguard_internal_errors_total{where}``. tests/unit/test_protocol.py finds every site
#: the scheduler's code names and fails on one that is missing here.
SCHEDULER_GUARD_SITES = frozenset(
    {
        "update_graph",
        "transition",
        "log_event",
        "add_worker",
        "report",
        "unguarded",
        "apply",
        "expire",
        "close",
        "task-erred",
        "store",
        "metrics",
        "dashboard",
        "pod_lookup",
        "slurm_lookup",
        "admission",
    }
)
