"""The executor (the one writer of kernel files) and the kubelet cgroup layout it writes in: the first part."""

from __future__ import annotations

import logging

from koordlet.agent.context import AgentContext, Component
from koordlet.executor import ResourceExecutor
from koordlet.executor.records import NodeRecords
from koordlet.system.cgroup import CgroupFS, detect_cgroup_driver
from koordlet.system.kubepods import KubeCgroupLayout

logger = logging.getLogger(__name__)


def executor(ctx: AgentContext) -> Component | None:
    """The executor, and the cgroup layout it writes in."""
    config = ctx.config
    cgroup_fs = ctx.cgroup_fs = CgroupFS.detect(ctx.dirs.cgroup_mount_dir)  # -cgroup-root-dir
    ctx.executor = ResourceExecutor(cgroup_fs, resctrl_root=ctx.dirs.resctrl_dir,
                                    force_update_seconds=float(config.resource_force_update_seconds),
                                    proc_dir=ctx.dirs.proc_dir, sys_dir=ctx.dirs.sys_dir,
                                    originals_file=config.system_config_record_file or None,
                                    records=NodeRecords.beside(config.system_config_record_file))
    driver = detect_cgroup_driver(cgroup_fs, config.kubelet_cgroup_root)
    layout = ctx.layout = KubeCgroupLayout(driver, config.kubelet_cgroup_root)
    logger.info("cgroup %s, driver %s, kubelet cgroup root %s", cgroup_fs.version.name, driver.value,
                layout.cgroup_root)
    return None
