"""The local demo (`make demo`): real containerd, the proxy in front of it, pods, visible results."""
