"""Dispatcher: moves every queue's new records into the cold tier, every 20 s."""

from tiered.dispatcher.archiver import ArchiveOptions, QueueArchiver, QueueResult
from tiered.dispatcher.commitpass import PassOptions
from tiered.dispatcher.filters import TopicFilter, is_system_topic
from tiered.dispatcher.round import Dispatcher, DispatchOptions, RoundResult

__all__ = ["ArchiveOptions", "DispatchOptions", "Dispatcher", "PassOptions", "QueueArchiver", "QueueResult",
           "RoundResult", "TopicFilter", "is_system_topic"]
