"""The wiring of each subsystem: one module a subsystem, each holding the factories ``(AgentContext) -> Component |
None`` that build its parts from the configuration and what the parts before them built. The order they run in is
koordlet/agent/parts.py's table."""
