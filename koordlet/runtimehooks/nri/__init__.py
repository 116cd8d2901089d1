"""koordlet as an NRI plugin (containerd >= 1.7): the second front door beside the hook server, where the same
``hooks/`` plugins decide. ``handlers`` answers the events, ``convert`` turns NRI messages into plugin
contexts and plugin results into NRI answers, ``plugin`` keeps the one connection to the runtime; the
protocol itself (ttrpc, the NRI mux, the Plugin service) is in ``wire``. Operators: docs/nri.md."""

from .handlers import EVENTS, NriHandlers
from .plugin import NriConfig, NriPlugin

__all__ = ["EVENTS", "NriConfig", "NriHandlers", "NriPlugin"]
