"""The agent: what koordlet/main.py hands the parsed command line to.

- context.py: the AgentContext the parts are built on, the Component and Part they are;
- parts.py: the table of contents, every part in start order;
- wiring/: the factories, one module a subsystem (executor, states, devices, metricsadvisor, prediction, qos,
  hooks, network, nodestate, reporters);
- lifecycle.py: Koordlet, which starts the parts in that order and stops them in reverse within the stop budget.
"""
