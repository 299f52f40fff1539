{{/* Chart name, truncated to the 63 characters of a label value. */}}
{{- define "gatehouse.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Resource name prefix: fullnameOverride, else <release>-<chart> (just <release> when it
already contains the chart name). 55 characters, so suffixes such as "-metrics" still fit.
*/}}
{{- define "gatehouse.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 55 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 55 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 55 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "gatehouse.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gatehouse.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gatehouse.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "gatehouse.labels" -}}
helm.sh/chart: {{ include "gatehouse.chart" . }}
{{ include "gatehouse.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gatehouse
{{- end }}

{{- define "gatehouse.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "gatehouse.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "gatehouse.leaseName" -}}
{{- default (printf "%s-leader" (include "gatehouse.fullname" .)) .Values.leaderElection.leaseName }}
{{- end }}

{{- define "gatehouse.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{/* host:port for --admin-address, with IPv6 addresses in brackets. */}}
{{- define "gatehouse.adminAddress" -}}
{{- $host := .Values.admin.bindAddress }}
{{- if contains ":" $host }}
{{- printf "[%s]:%d" $host (int .Values.admin.port) }}
{{- else }}
{{- printf "%s:%d" $host (int .Values.admin.port) }}
{{- end }}
{{- end }}

{{/*
The ports the pods bind for Gateway listeners: service.ports[].targetPort (default: port).
Fails the render on a non-integer targetPort, since NET_BIND_SERVICE is computed from it.
*/}}
{{- define "gatehouse.listenerPorts" -}}
{{- $ports := list }}
{{- range .Values.service.ports }}
{{- $target := .targetPort | default .port }}
{{- if not (kindIs "float64" $target) }}
{{- if not (regexMatch "^[0-9]+$" (toString $target)) }}
{{- fail (printf "service.ports: targetPort of %q must be an integer (the Gateway listener port), not %q" (toString .name) (toString $target)) }}
{{- end }}
{{- end }}
{{- $ports = append $ports (int $target) }}
{{- end }}
{{- toJson $ports }}
{{- end }}

{{/* "true" when the container gets NET_BIND_SERVICE (see netBindService in values.yaml). */}}
{{- define "gatehouse.netBindService" -}}
{{- $mode := toString .Values.netBindService }}
{{- if eq $mode "true" }}
{{- "true" }}
{{- else if eq $mode "auto" }}
{{- $low := lt (int .Values.admin.port) 1024 }}
{{- range (include "gatehouse.listenerPorts" . | fromJsonArray) }}
{{- if lt (int .) 1024 }}{{ $low = true }}{{ end }}
{{- end }}
{{- if $low }}{{ "true" }}{{ end }}
{{- else if ne $mode "false" }}
{{- fail (printf "netBindService must be auto, true or false, not %q" $mode) }}
{{- end }}
{{- end }}
