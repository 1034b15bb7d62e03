"""Every sentence a person reads about a death or a run, as pure functions of plain values.

What killed a worker (`causes`), a death's evidence, culprit and log line (`deaths`), why a
pipeline was aborted (`aborts`), a run in one sentence (`summaries`), where a crash lives
(`environments`). The deciding code
(`oomguard._decide`, the scheduler plugin's actions, the nanny's report) counts and decides,
and calls these for its words; nothing here decides anything.
"""

from .aborts import abort_message, no_larger_abort_message, no_larger_message, over_budget_message
from .causes import describe_cause, exception_name, shard_name, subject
from .deaths import (
    NO_REPORT_SOURCE,
    UNASKED_EXIT_SOURCE,
    UNASKED_EXIT_SUMMARY,
    culprit_line,
    death_line,
    evidence_summary,
    sampled_stack,
    suspects_line,
)
from .environments import environment_line, suspects_phrase, suspects_sentence
from .incidents import incident_summary
from .summaries import pipeline_summary

__all__ = [
    "NO_REPORT_SOURCE",
    "UNASKED_EXIT_SOURCE",
    "UNASKED_EXIT_SUMMARY",
    "abort_message",
    "culprit_line",
    "death_line",
    "describe_cause",
    "environment_line",
    "evidence_summary",
    "exception_name",
    "incident_summary",
    "no_larger_abort_message",
    "no_larger_message",
    "over_budget_message",
    "pipeline_summary",
    "sampled_stack",
    "shard_name",
    "subject",
    "suspects_line",
    "suspects_phrase",
    "suspects_sentence",
]
