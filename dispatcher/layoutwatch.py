"""The dispatcher's look at the store layout: surveyed at most once a
minute, counted in ``tiered_store_unknown_layout``, each new finding logged
once, and the topics whose queue type tiered cannot read kept out of rounds
(archiving them as simple queues would archive what they are not)."""

from __future__ import annotations

import logging

from tiered.clock import Clock
from tiered.recorder import Recorder
from tiered.store.localstore import LocalStore
from tiered.store.survey import Finding, StoreSurvey, survey_store

log = logging.getLogger(__name__)

SURVEY_INTERVAL_S = 60.0  # names and 8 bytes per CommitLog file: cheap, but not every 20 s round


class LayoutWatch:
    def __init__(self, local: LocalStore, recorder: Recorder, clock: Clock) -> None:
        self.local, self.recorder, self.clock = local, recorder, clock
        self._survey = StoreSurvey(findings=())
        self._at: float | None = None
        self._logged: set[Finding] = set()

    def current(self) -> StoreSurvey:
        """The last survey, taken again when it is older than SURVEY_INTERVAL_S."""
        now = self.clock.monotonic()
        if self._at is not None and now - self._at < SURVEY_INTERVAL_S:
            return self._survey
        try:
            survey = survey_store(self.local.root)
        except OSError as exc:  # the store cannot be listed: keep what we knew, say so
            log.error("cannot survey the store layout; the last survey stands: %s", exc)
            return self._survey
        self._survey, self._at = survey, now
        self.recorder.store_layout(survey.counts())
        for finding in survey.findings:
            if finding not in self._logged:
                log.warning("store %s: %s", self.local.root, finding.line())
        self._logged = set(survey.findings)
        return survey
