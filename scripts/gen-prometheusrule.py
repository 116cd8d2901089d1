#!/usr/bin/env python3
"""Write the chart's PrometheusRule template from the one source of the alert rules.

    python3 scripts/gen-prometheusrule.py          # writes deploy/chart/koordlet-py/templates/prometheusrule.yaml
    python3 scripts/gen-prometheusrule.py --check  # exit 1 when the template is not what this would write

The rules live in deploy/prometheus/koordlet-rules.yaml (a plain Prometheus rules file); the template carries
its ``groups:`` as the PrometheusRule's spec, with each ``{{ ... }}`` of the alert templates (``$labels``,
``$value``) quoted for Helm so that Prometheus gets them as written, and each ``runbook_url`` made of the value
``prometheusRule.runbookURL`` and the rules file's anchor. tests/deploy/test_prometheus.py runs ``--check`` and
compares what Helm renders with the rules file.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "deploy" / "prometheus" / "koordlet-rules.yaml"
TEMPLATE = ROOT / "deploy" / "chart" / "koordlet-py" / "templates" / "prometheusrule.yaml"

HEAD = """\
{{- /* Generated from deploy/prometheus/koordlet-rules.yaml by scripts/gen-prometheusrule.py: edit that file and
run the script (a test fails when this one is stale). */ -}}
{{- if .Values.prometheusRule.enabled }}
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: {{ include "koordlet-py.fullname" . }}
  namespace: {{ .Release.Namespace }}
  labels:
    {{- include "koordlet-py.labels" . | nindent 4 }}
    {{- with .Values.prometheusRule.labels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
"""
TAIL = "{{- end }}\n"
# The rules file's stand-in for where docs/operations.md is served (koordlet-rules.yaml says how to replace it).
RUNBOOK_BASE = "https://koordlet-py.invalid/docs/operations.md"
_RUNBOOK = re.compile(r"runbook_url: " + re.escape(RUNBOOK_BASE) + r"#([a-z0-9-]+)$", re.MULTILINE)


def render(rules_text: str) -> str:
    start = rules_text.find("\ngroups:")
    if start < 0:
        raise SystemExit(f"{RULES}: no top-level groups:")
    body = rules_text[start + 1:]
    if "`" in body:
        raise SystemExit(f"{RULES}: a backtick cannot be quoted for Helm; write the text without one")
    quoted = re.sub(r"\{\{.*?\}\}", lambda match: "{{`" + match.group(0) + "`}}", body)
    if len(_RUNBOOK.findall(quoted)) != quoted.count("runbook_url:"):
        raise SystemExit(f"{RULES}: every runbook_url must be {RUNBOOK_BASE}#<anchor>")
    quoted = _RUNBOOK.sub(r'runbook_url: {{ printf "%s#\1" .Values.prometheusRule.runbookURL | quote }}', quoted)
    return HEAD + "".join(f"  {line}" if line else line for line in quoted.splitlines(keepends=True)) + TAIL


def main(argv: list[str]) -> int:
    wanted = render(RULES.read_text())
    if argv[1:] == ["--check"]:
        if not TEMPLATE.exists() or TEMPLATE.read_text() != wanted:
            print(f"{TEMPLATE.relative_to(ROOT)} is stale: run python3 scripts/gen-prometheusrule.py", file=sys.stderr)
            return 1
        return 0
    TEMPLATE.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
