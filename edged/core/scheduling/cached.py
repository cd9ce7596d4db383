"""The response cache in front of a model's scheduler, where Triton consults it: before a request is queued, and
after the model answered a request the cache did not hold (edged.core.response_cache holds the entries).

Triton's accounting: a hit is a success whose duration and queue time count, with the lookup's time as
``cache_hit``, and neither an inference nor an execution; a miss runs the model as usual, then adds the lookup and
insertion time as ``cache_miss`` and to the request's duration. A request whose response another one stored while
it ran is neither (Triton's insert finds it there and counts nothing). Failed requests are not cached.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from edged.errors import AnsweredError, EdgedError

if TYPE_CHECKING:
    from edged.core.request.inference import InferRequest, InferResponse
    from edged.core.response_cache import CachePartition, ResponseCache
    from edged.core.scheduling.scheduler import Scheduler
    from edged.core.stats import ModelStatistics
    from edged.proto.model_config_pb2 import ModelConfig

log = logging.getLogger(__name__)


def with_response_cache(
    scheduler: Scheduler, config: ModelConfig, stats: ModelStatistics, cache: ResponseCache | None
) -> Scheduler:
    """``scheduler`` behind the cache when the model's config enables it and the device has one (a config that
    asks for a cache the device lacks is among the fields not acted upon: edged.core.config.unacted)."""
    if not config.response_cache.enable or cache is None:
        return scheduler
    return CachedScheduler(scheduler, cache, cache.partition(stats.name, stats.version), stats)


class CachedScheduler:
    """A scheduler's requests answered from the cache where it holds them. The version's entries are dropped when
    it drains: the repository drains a version only as it is unloaded or replaced (or the daemon stops)."""

    def __init__(self, inner: Scheduler, cache: ResponseCache, partition: CachePartition, stats: ModelStatistics):
        self._inner = inner
        self._cache = cache
        self._partition = partition
        self._stats = stats
        stats.cache_enabled = True

    async def enqueue(self, request: InferRequest) -> InferResponse | EdgedError | None:
        cache, stats = self._cache, self._stats
        key = cache.key(self._partition, request)
        lookup_start = time.monotonic_ns()
        cached = cache.lookup(key, request)
        lookup_ns = time.monotonic_ns() - lookup_start
        if cached is not None:
            cache.counts.hits += 1
            cache.counts.lookup_ns += lookup_ns
            end = time.monotonic_ns()
            stats.record_cache_hit(end - request.arrival_ns, lookup_start - request.arrival_ns, lookup_ns)
            return cached
        result = await self._inner.enqueue(request)
        if result is None or (isinstance(result, EdgedError) and not isinstance(result, AnsweredError)):
            return result
        if key in cache:  # stored by an identical request that finished first
            return result
        insert_start = time.monotonic_ns()
        if not isinstance(result, EdgedError):
            cache.insert(self._partition, key, result)
        insert_ns = time.monotonic_ns() - insert_start
        cache.counts.misses += 1
        cache.counts.lookup_ns += lookup_ns
        cache.counts.insertion_ns += insert_ns
        stats.record_cache_miss(lookup_ns + insert_ns)
        return result

    async def drain(self) -> None:
        await self._inner.drain()
        self._cache.drop(self._partition)

    def __getattr__(self, name: str) -> Any:
        # The rest of the scheduler's interface (instances added and removed as a model is resized) is the inner one's.
        return getattr(self._inner, name)
