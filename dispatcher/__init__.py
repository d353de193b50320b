"""Dispatcher: moves every queue's new records into the cold tier, every 20 s."""

from dispatcher.archiver import ArchiveOptions, QueueArchiver, QueueResult
from dispatcher.commitpass import PassOptions
from dispatcher.filters import TopicFilter, is_system_topic
from dispatcher.round import Dispatcher, DispatchOptions, RoundResult

__all__ = ["ArchiveOptions", "DispatchOptions", "Dispatcher", "PassOptions", "QueueArchiver", "QueueResult",
           "RoundResult", "TopicFilter", "is_system_topic"]
