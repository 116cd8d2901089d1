"""States informer: node, NodeSLO and pods from their sources, with change callbacks (docs/koordinator.md §8).

- ``api``: the StatesProvider protocol everything else codes against;
- ``informer``: StatesInformer, the provider: pods polled from a pod source, node/NodeSLO pushed in;
- ``kubelet`` (kubelet ``/pods`` over HTTPS) and ``cri`` (the runtime itself): pod sources;
- ``kube``: node and NodeSLO list+watch from the API server; ``nodeslo_file``: NodeSLO from a watched file;
- ``pleg``: new pod cgroups trigger an immediate pod sync; ``cgroups``: pods as the collectors' cgroup dirs.
"""
