"""The Koordinator API as the node side sees it; imports nothing else of koordlet (hooks/ may import it).

Modules: ``keys`` (label, annotation and resource names), ``qos`` (QoS and priority classes and the pod
mappings), ``pod`` (PodMeta/ContainerMeta), ``quantity`` and ``cpuset`` (value syntaxes),
``annotations`` (parsers of the JSON annotations), ``nodeslo`` (NodeSLO spec types, defaults, merge),
``device`` (GPU names and the device-allocated protocol).
"""
