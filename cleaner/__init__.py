"""Cleaner: expires archived segments past their topic's retention, merges
small adjacent segments, and collects orphans. Decides first (``plan``, a
pure function of manifests, retention and a clock), then acts (``execute``).
"""

from tiered.cleaner.clean import CleanOptions, Cleaner
from tiered.cleaner.plan import CleanPlan, MergeRun, PlanOptions, QueuePlan, Verdict, make_plan, plan_orphans, verdict
from tiered.cleaner.report import CleanReport
from tiered.cleaner.retention import Retention, RetentionPolicy, load_retention

__all__ = ["CleanOptions", "CleanPlan", "CleanReport", "Cleaner", "MergeRun", "PlanOptions", "QueuePlan",
           "Retention", "RetentionPolicy", "Verdict", "load_retention", "make_plan", "plan_orphans", "verdict"]
