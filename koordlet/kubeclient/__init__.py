"""How koordlet talks to the API server at fleet scale (docs/design.md §5, "One node of thousands").

client-go's ``tools/cache`` in three parts, each taking a clock (and where it draws lots, a random source), so a
unit test pins its timing without sleeping and the fleet bench (bench/fleet.py) runs thousands of them in one
process on virtual time:

- :mod:`.timing`: the clock and the jitter every periodic API action takes;
- :mod:`.backoff`: exponential backoff with full jitter, for one loop's retries;
- :mod:`.budget`: the koordlet-wide request budget: a token bucket (``-kube-api-qps``, ``-kube-api-burst``) and the
  pushback state that slows every part of koordlet together when the API server answers 429 or 503;
- :mod:`.reflector`: list at resourceVersion 0, watch from the last version or bookmark, list again only on 410.

What sends the requests is :mod:`koordlet.kubeapi`.
"""
