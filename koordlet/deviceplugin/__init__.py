"""Kubelet device plugin for GPUs that hands each pod the devices the scheduler chose (docs/node-lock.md)."""
