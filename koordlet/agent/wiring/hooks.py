"""The runtime hooks: the hook server (for the proxy), the NRI plugin (for containerd >= 1.7, registered early,
before the states sync wait) and the reconciler, one RuntimeHooks built once for both parts."""

from __future__ import annotations

from typing import TYPE_CHECKING

from koordlet.agent.context import AgentContext, Component, Running
from koordlet.agent.wiring.extensions import gates_with_extensions
from koordlet.config import KoordletConfig
from koordlet.events import PodEvents

if TYPE_CHECKING:
    from koordlet.runtimehooks import RuntimeHooks
    from koordlet.runtimehooks.nri import NriConfig


def nri_config(config: KoordletConfig) -> NriConfig | None:
    """NRI mode from the ``-runtime-hooks-nri-*`` flags; None with ``-enable-nri-runtime-hook=false``."""
    from koordlet.runtimehooks.nri import NriConfig

    if not config.enable_nri_runtime_hook:
        return None
    return NriConfig(socket_path=config.nri_socket_path, plugin_name=config.runtime_hooks_nri_plugin_name,
                     plugin_index=config.runtime_hooks_nri_plugin_index,
                     connect_timeout_s=config.runtime_hooks_nri_connect_timeout_s,
                     backoff_s=config.runtime_hooks_nri_backoff_duration_s,
                     backoff_factor=config.runtime_hooks_nri_backoff_factor,
                     backoff_steps=config.runtime_hooks_nri_backoff_steps,
                     backoff_cap_s=config.runtime_hooks_nri_backoff_cap_s,
                     fail_on_error=config.runtime_hooks_plugin_failure_policy == "Fail")


def nri_plugin(ctx: AgentContext) -> Component | None:
    """The NRI plugin, registered before the states sync wait: an NRI request carries the pod's labels and
    annotations, so it needs no pod list, and a pod created while the list is not there yet still gets its
    values. The rest of the runtime hooks start in their place (:func:`runtime_hooks`)."""
    if not ctx.config.enable_nri_runtime_hook:
        return None
    hooks = built_runtime_hooks(ctx)
    hooks.start_nri()
    return Running(hooks.stop_nri)


def runtime_hooks(ctx: AgentContext) -> Component | None:
    """The hook server (for the proxy), the NRI plugin (for containerd >= 1.7; started already by
    :func:`nri_plugin`) and the reconciler."""
    return built_runtime_hooks(ctx)


def built_runtime_hooks(ctx: AgentContext) -> RuntimeHooks:
    from koordlet.runtimehooks import RuntimeHooks, RuntimeHooksConfig

    if ctx.runtime_hooks is not None:
        return ctx.runtime_hooks
    config = ctx.config
    hooks_config = RuntimeHooksConfig(
        socket_path=config.runtime_hooks_addr,
        host_endpoint=config.runtime_hooks_host_endpoint,
        config_dir=config.runtime_hooks_config_path,
        failure_policy=config.runtime_hooks_failure_policy,
        disabled_stages=frozenset(config.runtime_hooks_disable_stages),
        reconcile_interval_s=config.runtime_hooks_reconcile_interval_s,
        feature_gates=gates_with_extensions(ctx),
        resctrl_dir=ctx.dirs.resctrl_dir,
        serve_hooks=config.runtime_hooks_network == "unix",
        sys_dir=ctx.dirs.sys_dir,
        proc_dir=ctx.dirs.proc_dir,
        dev_dir=ctx.dirs.dev_dir,
        hami_core_library=config.hami_core_library_directory_path,
        disable_unset_cpu_quota=config.disable_unset_cpu_quota,
        node_name=config.node_name,
        nri=nri_config(config),
        weight_formula=config.cgroup_v2_weight_formula,
    )
    warn = PodEvents(config.node_name, ctx.api_client).warning if ctx.api_client is not None else None
    task_ids = ctx.states.container_task_ids if config.enable_pod_taskids else None
    hooks = ctx.runtime_hooks = RuntimeHooks(hooks_config, ctx.states, ctx.executor, ctx.layout, warn, ctx.cpu_manager,
                                             task_ids)
    ctx.health.watch_loop("reconciler", hooks.reconciler.loop)
    if hooks.nri is not None:
        from koordlet.runtimehooks.nri.plugin import socket_identity

        ctx.health.watch_nri(hooks.nri, lambda path: socket_identity(path) is not None)
    return hooks
