{{/* The release's resources are named <release>-toolsentry, or <release> when it says so. */}}
{{- define "toolsentry.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "toolsentry.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "toolsentry.labels" -}}
{{ include "toolsentry.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* The Secret holding the admin key: the one named, or the chart's own. */}}
{{- define "toolsentry.adminSecret" -}}
{{- .Values.adminKey.existingSecret | default (printf "%s-admin" (include "toolsentry.fullname" .)) -}}
{{- end -}}

{{/* What the values may not combine, each refused with a message saying what to set. */}}
{{- define "toolsentry.validate" -}}
{{- if and (not .Values.adminKey.existingSecret) (not .Values.adminKey.value) -}}
{{- fail "adminKey: set adminKey.existingSecret (a Secret holding the key) or adminKey.value; the proxy listens on every interface of its pod and guards its session API and /metrics with it" -}}
{{- end -}}
{{- if and (eq .Values.store.type "memory") (or (gt (int .Values.replicaCount) 1) .Values.autoscaling.enabled) -}}
{{- fail "store.type memory keeps each pod's sessions to itself: with replicaCount > 1 or autoscaling, use store.type redis" -}}
{{- end -}}
{{- if and (eq .Values.store.type "redis") (not .Values.store.redis.internal) (not .Values.store.redis.external.existingSecret) -}}
{{- fail "store.redis.internal is false: name the Secret holding the redis:// URL in store.redis.external.existingSecret" -}}
{{- end -}}
{{- end -}}
