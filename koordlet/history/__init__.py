"""What koordlet did and why, kept a while for ``/debug/pods`` and ``koordlet explain`` (koordlet/debug/ serves it):

- :mod:`.actions`: the last writes and evictions of every cgroup dir and pod, recorded by the plan runners;
- :mod:`.answers`: what each hook plugin answered when a pod and its containers were created, recorded where the
  hook server, the NRI handlers and the reconciler run the plugins.

Both are bounded and forget a pod when it goes. They sit below the parts that record into them (the runner, the
runtime hooks), apart from the endpoints that read them, which sit above everything they show.
"""
