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

{{/* Provisioned mode: where the sync server listens (admin.bindAddress, provisioning.syncPort). */}}
{{- define "gatehouse.syncAddress" -}}
{{- $host := .Values.admin.bindAddress }}
{{- if contains ":" $host }}
{{- printf "[%s]:%d" $host (int .Values.provisioning.syncPort) }}
{{- else }}
{{- printf "%s:%d" $host (int .Values.provisioning.syncPort) }}
{{- end }}
{{- end }}

{{/* Provisioned mode: the sync Service's name in the cluster, <fullname>.<namespace>.svc. */}}
{{- define "gatehouse.syncHost" -}}
{{- printf "%s.%s.svc" (include "gatehouse.fullname" .) .Release.Namespace }}
{{- end }}

{{/* Provisioned mode: the Secret holding the control plane's CA (release namespace). */}}
{{- define "gatehouse.caSecretName" -}}
{{- default (printf "%s-ca" (include "gatehouse.fullname" .)) .Values.provisioning.caSecretName }}
{{- end }}
