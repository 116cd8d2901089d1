#!/bin/sh
# v2-systemd-init.sh — PID 1 of the systemd guest of the cgroup v2 stage (scripts/v2-stage.sh, never on a
# host): makes the read-only 9p root usable for systemd (proc, sys, dev, a tmpfs /run, overlays on /etc /var
# /tmp /root), mounts the host's results dir, writes a target that runs scripts/v2-guest.sh once and powers
# the guest off, masks the host's units that cannot work here, and execs systemd.
#
# Why not `vng --systemd`: the guest sees the host's /.dockerenv through the shared root, so systemd takes
# itself for a container, ignores the kernel command line and boots the host's whole multi-user.target
# (containerd, getty, logind...), and with --exec the console goes to /dev/null: the run never ends. Here
# `container=` (empty) tells systemd it is not in a container, and the units it runs are ours.
#
# Kernel command-line parameters (the kernel passes unknown key=value pairs to PID 1's environment):
#   kpy_repo   the checkout (readable at the same path in the guest)
#   kpy_out    the results dir, shared read-write as virtme's 9p tag virtme.initmount0 (vng --rwdir)
#   kpy_args   pytest arguments for v2-guest.sh, ':'-separated
#   kpy_venv   the virtualenv v2-guest.sh runs (KPY_VENV)
#   kpy_host_done  the file whose existence says the host's stages beside the VM are done (KPY_V2_HOST_DONE)
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
mount -t proc -o nosuid,nodev,noexec proc /proc
mount -t sysfs -o nosuid,nodev,noexec sysfs /sys
mount -t devtmpfs -o mode=0755,nosuid devtmpfs /dev 2>/dev/null
mount -t tmpfs -o mode=0755,nosuid,nodev tmpfs /run
modprobe overlay 2>/dev/null
for d in etc var tmp root; do
  mkdir -p "/run/.ov/$d/u" "/run/.ov/$d/w"
  mount -t overlay -o "lowerdir=/$d,upperdir=/run/.ov/$d/u,workdir=/run/.ov/$d/w" overlay "/$d"
done
# After the overlays, so that a results dir under one of them is not hidden by it.
mount -t 9p -o rw,version=9p2000.L,trans=virtio,access=any,msize=524288 virtme.initmount0 "$kpy_out" ||
  echo "v2-systemd-init: cannot mount the results dir $kpy_out" > /dev/console
: > /etc/fstab
# systemd-tmpfiles --boot would empty /tmp (Debian's tmp.conf "D /tmp"), and with it a checkout under /tmp.
mkdir -p /etc/tmpfiles.d
ln -sf /dev/null /etc/tmpfiles.d/tmp.conf
mkdir -p /run/systemd/system
# The host's units that fail or wait here (no logins, no network time, no host containerd or databases).
for u in containerd.service docker.service postgresql.service postgresql@15-main.service \
         systemd-timesyncd.service systemd-logind.service e2scrub_reap.service systemd-networkd.service \
         getty@tty1.service console-getty.service serial-getty@ttyS0.service; do
  ln -sf /dev/null "/run/systemd/system/$u"
done
args=$(printf '%s' "${kpy_args:-}" | tr ':' ' ')
cat > /run/systemd/system/kpy-v2.target <<UNIT
[Unit]
Description=koordlet-py cgroup v2 stage (systemd guest)
Requires=kpy-v2.service
After=kpy-v2.service
AllowIsolate=yes
UNIT
cat > /run/systemd/system/kpy-v2.service <<UNIT
[Unit]
Description=koordlet-py cgroup v2 tests on the systemd cgroup driver
Wants=basic.target dbus.service
After=basic.target dbus.service
SuccessAction=poweroff-force
FailureAction=poweroff-force
[Service]
Type=oneshot
Environment=KPY_VENV=${kpy_venv:-$kpy_repo/.venv} KPY_V2_OUT=$kpy_out KPY_V2_MODE=tests KPY_CGROUP_DRIVER=systemd CTRD_SYSTEMD_CGROUP=1 CTRD_NO_INSTALL=1
Environment=KPY_V2_HOST_DONE=${kpy_host_done:-}
ExecStart=/bin/bash $kpy_repo/scripts/v2-guest.sh $args
StandardOutput=journal+console
StandardError=journal+console
TimeoutStartSec=infinity
UNIT
export container=
exec /lib/systemd/systemd
