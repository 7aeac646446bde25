"""schedkit's component library, sorted by the step a request takes through a scheduler:
``scheduler/`` (the loop, queue, policies, batching, results, load), ``cache/`` (KV pool and
prefix caches), ``io/`` (requests in, outputs and KV events out) and ``metrics/``.

The package is advertised under the ``schedkit.components`` entry-point group. Importing it
declares every component by name and imports none: a component's module is imported the first
time a wiring names it (``schedkit.core.component.lookup``).
"""

from schedkit.core.component import declare_modules

COMPONENT_MODULES: dict[str, str] = {
    "parallel_state": "schedkit.core.parallel_state",
    # scheduler/
    "scheduler": "schedkit.components.scheduler.scheduler",
    "fcfs": "schedkit.components.scheduler.schedule_policy",
    "lpm": "schedkit.components.scheduler.schedule_policy",
    "priority": "schedkit.components.scheduler.schedule_policy",
    "dfs-weight": "schedkit.components.scheduler.cache_aware_policies",
    "hrrn": "schedkit.components.scheduler.cache_aware_policies",
    "shortest-prefill-first": "schedkit.components.scheduler.cache_aware_policies",
    "lof": "schedkit.components.scheduler.cache_agnostic_policies",
    "random": "schedkit.components.scheduler.cache_agnostic_policies",
    "routing-key": "schedkit.components.scheduler.cache_agnostic_policies",
    "batch_result_processor": "schedkit.components.scheduler.batch_result_processor",
    "load_inquirer": "schedkit.components.scheduler.load_inquirer",
    # cache/
    "token_to_kv_pool_allocator": "schedkit.components.cache.allocator",
    "radix_cache": "schedkit.components.cache.radix_cache",
    "swa_radix_cache": "schedkit.components.cache.swa_radix_cache",
    "hiradix_cache": "schedkit.components.cache.hiradix_cache",
    # io/
    "inproc_request_receiver": "schedkit.components.io.request_receiver",
    "zmq_server": "schedkit.components.io.zmq_server",
    "output_streamer": "schedkit.components.io.output_streamer",
    "inproc_output_collector": "schedkit.components.io.output_sender",
    "output_tally": "schedkit.components.io.output_sender",
    "zmq_output_sender": "schedkit.components.io.output_sender",
    "kv_events_publisher": "schedkit.components.io.kv_events_publisher",
    # metrics/
    "metrics_reporter": "schedkit.components.metrics.reporter",
    # the HTTP front end (a process of its own)
    "http_server": "schedkit.http.launcher",
    # the simulated model runner
    "simulated_model_runner": "schedkit.runner.model_runner",
}

declare_modules(COMPONENT_MODULES)
