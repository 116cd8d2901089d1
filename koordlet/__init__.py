"""koordlet."""

from koordlet.system.lightimport import register_without_init

# The kubernetes package's __init__ loads every part of the client: config with kube_config's auth plugins
# (google.auth, oauthlib, requests-oauthlib), dynamic, stream, informer, leader election. koordlet uses the
# ApiClient, the exceptions, the watch's line reader and the in-cluster configuration; the rest loads only when
# something asks for it (a kubeconfig file loads kube_config): about 6.5 MiB less in an agent with an API server,
# 14.5 MiB in local mode, which builds no client (docs/benchmarks.md).
register_without_init("kubernetes")
register_without_init("kubernetes.config")
