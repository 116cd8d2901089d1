"""Hook plugins: pure functions from a pod or container context and a rule to the settings it wants.

Each plugin is one module: a rule parsed from the NodeSLO and the node (``rule``), and handlers for the
levels it cares about (``pod``, ``container``), registered in :mod:`hooks.registry`. Nothing here reads
or writes a file: the hook server answers with the results, and the reconciler applies them through the
executor. ``hooks`` imports only ``koordlet.api`` (tests/test_layering.py).
"""
