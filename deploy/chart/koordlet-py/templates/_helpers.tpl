{{/* The koordlet image: [imageRepositoryHost/]repository:tag, the tag defaulting to the chart's appVersion. */}}
{{- define "koordlet-py.image" -}}
{{- $image := .Values.koordlet.image -}}
{{- $repository := $image.repository -}}
{{- with .Values.imageRepositoryHost }}{{ $repository = printf "%s/%s" (trimSuffix "/" .) $repository }}{{ end -}}
{{- printf "%s:%s" $repository (default .Chart.AppVersion $image.tag) -}}
{{- end }}

{{/* Labels on every object the chart makes (the same as deploy/base carries). */}}
{{- define "koordlet-py.labels" -}}
app.kubernetes.io/name: koordlet
app.kubernetes.io/part-of: koordlet-py
{{- end }}
