"""The seams of a scheduler: what each component needs of the components it is wired to.

A scheduler step runs through these seams in order (docs/architecture.md follows a request
through them with the file and function of each hop):

1. ``RequestReceiver.recv_requests`` hands the scheduler what arrived since the last step.
2. ``SchedulePolicy.calc_priority`` orders the waiting queue; admission matches, locks and
   fills ``PrefixCache`` entries and takes slots from the ``KVAllocator``.
3. ``ModelRunner.forward`` runs the batch and returns its next tokens, on its own ``Clock``.
4. ``BatchResultProcessor.process_batch_result`` applies the tokens: it appends them, finishes
   requests, caches their KV (``PrefixCache.cache_finished_req``/``cache_unfinished_req``)
   and asks the ``OutputStreamer`` to stream what is due.
5. ``OutputStreamer.stream_output`` packs one message per step for the ``OutputSender``.
6. Around the step, the metrics reporter reads pool and queue figures from a ``LoadInquirer``.

Each component annotates its collaborator fields with these protocols (the edges, in
``edge_protocols``). ``schedkit validate`` checks that the component an eager ``!ref`` names has
every member of the field's protocol, so a wrong or incompatible component is reported at its
file and line before anything is built. Any class with the members fits: a fake in a test
inherits from nothing. Each wiring key also has the protocol of the whole component under it
(``component_protocols``, ``COMPONENT_PROTOCOLS``). This module names both.
"""

from __future__ import annotations

from schedkit.core.component_protocols import (
    COMPONENT_PROTOCOLS,
    DecodeStepCounter,
    KVEventsPublisherComponent,
    LoadInquirerComponent,
    MetricsReporterComponent,
    ModelRunnerComponent,
    SchedulerComponent,
    SchedulerStats,
)
from schedkit.core.edge_protocols import (
    BatchResultProcessor,
    Clock,
    KVAllocator,
    LoadInquirer,
    ModelRunner,
    OutputSender,
    OutputStreamer,
    PrefixCache,
    RequestReceiver,
    SchedulePolicy,
)

__all__ = [
    "COMPONENT_PROTOCOLS",
    "BatchResultProcessor",
    "Clock",
    "DecodeStepCounter",
    "KVAllocator",
    "KVEventsPublisherComponent",
    "LoadInquirer",
    "LoadInquirerComponent",
    "MetricsReporterComponent",
    "ModelRunner",
    "ModelRunnerComponent",
    "OutputSender",
    "OutputStreamer",
    "PrefixCache",
    "RequestReceiver",
    "SchedulePolicy",
    "SchedulerComponent",
    "SchedulerStats",
]
