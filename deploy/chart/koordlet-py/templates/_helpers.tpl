{{/* The chart's name: nameOverride, else the chart's own name. */}}
{{- define "koordlet-py.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end }}

{{/*
The name of every object the release makes (DaemonSet, ServiceAccount, ClusterRole, ...): fullnameOverride, else
the release name when it already holds the chart's name, else <release>-<name>. Two releases never share one, and
none is a name Koordinator's own chart gives its koordlet's objects (those would collide beside it).
*/}}
{{- define "koordlet-py.fullname" -}}
{{- $name := include "koordlet-py.name" . -}}
{{- $fullname := "" -}}
{{- if .Values.fullnameOverride -}}
{{- $fullname = .Values.fullnameOverride -}}
{{- else if contains $name .Release.Name -}}
{{- $fullname = .Release.Name -}}
{{- else -}}
{{- $fullname = printf "%s-%s" .Release.Name $name -}}
{{- end -}}
{{- $fullname = $fullname | trunc 63 | trimSuffix "-" -}}
{{- if has $fullname (list "koordlet" "koordlet-role" "koordlet-rolebinding" "koordlet-service" "koordlet-service-monitor") -}}
{{- fail (printf "the name %q is one Koordinator's chart gives its own koordlet's objects: choose another release name or fullnameOverride" $fullname) -}}
{{- end -}}
{{- $fullname -}}
{{- end }}

{{/* helm.sh/chart: <chart>-<version>. */}}
{{- define "koordlet-py.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end }}

{{/* What the DaemonSet selects its pods by (and the Service and the monitors): this release's koordlet. */}}
{{- define "koordlet-py.selectorLabels" -}}
app.kubernetes.io/name: {{ include "koordlet-py.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The standard labels, on every object the chart makes. */}}
{{- define "koordlet-py.labels" -}}
helm.sh/chart: {{ include "koordlet-py.chart" . }}
{{ include "koordlet-py.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The koordlet image: [imageRepositoryHost/]repository:tag, the tag defaulting to the chart's appVersion. */}}
{{- define "koordlet-py.image" -}}
{{- $image := .Values.koordlet.image -}}
{{- $repository := $image.repository -}}
{{- with .Values.imageRepositoryHost }}{{ $repository = printf "%s/%s" (trimSuffix "/" .) $repository }}{{ end -}}
{{- printf "%s:%s" $repository (default .Chart.AppVersion $image.tag) -}}
{{- end }}
