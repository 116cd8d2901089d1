"""One device's line in the per-device blkio files, in either cgroup version's format (docs/koordinator.md §4.8).

The values koordlet writes are in the v1 form of the cgroup registry (``koordlet.system.resources``): ``"MAJ:MIN N"``
for the throttles and the weight, ``"MAJ:MIN key=value ..."`` for blk-iocost's ``qos`` and ``model``. What the
kernel lists differs by file and version:

- v1 ``blkio.throttle.*_device``: ``MAJ:MIN N`` for each device with a limit (no line: no limit);
- v2 ``io.max``: ``MAJ:MIN rbps=N wbps=max riops=max wiops=max`` (one line for the four throttles, ``max`` = no
  limit);
- ``io.weight`` (v2) and ``blkio.cost.weight`` (Anolis v1): ``default N`` and ``MAJ:MIN N`` per device (the
  ``default`` line is the registry's ``io.weight.default``, its "device" ``default``);
- ``io.cost.qos``/``io.cost.model`` (v2, root only; ``blkio.cost.*`` on Anolis v1): ``MAJ:MIN enable=1 ctrl=user
  rpct=95.00 …`` with every key the kernel keeps, numbers printed with two decimals.

:func:`line_of` reads one device's line back in the v1 form, :func:`holds` says whether a line holds a value
(the keys a write names, numbers compared as numbers: the kernel prints ``rpct=95.00`` for a written ``rpct=95``),
and :func:`absent_value` is what puts a device back to "no line" (the throttles' no limit, the default weight,
blk-iocost off and its model automatic).
"""

from __future__ import annotations

from koordlet.system.resources import IO_MAX_KEYS, device_of

IO_WEIGHT = "blkio.cost.weight"
IO_WEIGHT_DEFAULT_LINE = "io.weight.default"  # io.weight's "default N" line, as the line of the device "default"
IO_COST_QOS = "blkio.cost.qos"
IO_COST_MODEL = "blkio.cost.model"
_COST_FILES = (IO_COST_QOS, IO_COST_MODEL)
DEFAULT_WEIGHT = 100


def _fields(line: str) -> dict[str, str]:
    return dict(word.split("=", 1) for word in line.split() if "=" in word)


def line_of(resource: str, content: str, device: str) -> str | None:
    """``device``'s entry of ``resource`` in a file's ``content`` (either version), in the v1 form; None when the
    file has no line for the device (or, on v2 ``io.max``, none of this throttle)."""
    for raw in content.splitlines():
        head, _, rest = raw.strip().partition(" ")
        if head != device:
            continue
        rest = rest.strip()
        key = IO_MAX_KEYS.get(resource)
        if key is not None and "=" in rest:  # v2 io.max: one key of the line
            value = _fields(rest).get(key)
            if value is None:
                return None
            return f"{device} {0 if value == 'max' else value}"
        return f"{device} {rest}" if rest else None
    return None


def _same_number(wanted: str, current: str) -> bool:
    try:
        return float(wanted) == float(current)
    except ValueError:
        return wanted == current


def holds(resource: str, value: str, content: str) -> bool:
    """The file's ``content`` already holds the v1 ``value`` for its device: every key the value names has that
    value (blk-iocost), or the device's number is that number (throttles, weight; a throttle without a line has
    none, i.e. 0)."""
    device = device_of(value)
    current = line_of(resource, content, device)
    wanted_rest = value.partition(" ")[2]
    if current is None:  # no line: a throttle without a limit; anything else is not set
        return resource in IO_MAX_KEYS and wanted_rest.strip() == "0"
    current_rest = current.partition(" ")[2]
    if resource not in _COST_FILES:
        return _same_number(wanted_rest.strip(), current_rest.strip())
    have = _fields(current_rest)
    return all(key in have and _same_number(want, have[key]) for key, want in _fields(wanted_rest).items())


def absent_value(resource: str, device: str) -> str:
    """The v1 value that leaves ``device`` as a file without its line: no throttle, the default weight, blk-iocost
    off, the kernel's own model."""
    if resource == IO_COST_QOS:
        return f"{device} enable=0"
    if resource == IO_COST_MODEL:
        return f"{device} ctrl=auto"
    if resource in (IO_WEIGHT, IO_WEIGHT_DEFAULT_LINE):
        return f"{device} {DEFAULT_WEIGHT}"
    return f"{device} 0"
