"""Network QoS (gate ``TCNetworkQoS``): HTB classes per QoS class on the uplink, pods classified by IP.

:mod:`.plan` is the pure part (NodeSLO + pods -> qdisc/classes/filters); :mod:`koordlet.system.tc` reads
the link back and applies the difference with pyroute2.
"""

from koordlet.netqos.plan import NetPod, NetQoSError, NetQoSPlan, NetQoSSpec, net_pod, plan, spec_from_node_slo
from koordlet.system.tc import NetQoSApplyError, apply, diff, read_link, remove

__all__ = [
    "NetPod",
    "NetQoSApplyError",
    "NetQoSError",
    "NetQoSPlan",
    "NetQoSSpec",
    "apply",
    "diff",
    "net_pod",
    "plan",
    "read_link",
    "remove",
    "spec_from_node_slo",
]
