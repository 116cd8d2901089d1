"""Kubelet device plugin for GPUs that hands each pod the devices the scheduler chose (seed 000)."""
