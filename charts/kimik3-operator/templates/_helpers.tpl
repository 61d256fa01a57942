{{/* Chart name. */}}
{{- define "kimik3-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Full name: release-prefixed unless the release already carries the chart name. */}}
{{- define "kimik3-operator.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "kimik3-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kimik3-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kimik3-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "kimik3-operator.labels" -}}
helm.sh/chart: {{ include "kimik3-operator.chart" . }}
{{ include "kimik3-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "kimik3-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "kimik3-operator.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The Lease the replicas elect their leader on, in the release namespace. */}}
{{- define "kimik3-operator.leaseName" -}}
{{- include "kimik3-operator.fullname" . -}}
{{- end -}}

{{- define "kimik3-operator.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "kimik3-operator.testImage" -}}
{{- if .Values.test.image.digest -}}
{{- printf "%s@%s" .Values.test.image.repository .Values.test.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.test.image.repository .Values.test.image.tag -}}
{{- end -}}
{{- end -}}

{{/*
A map of labels as k=v,k=v (sorted), for KIMIK3_PODMONITOR_LABELS.
*/}}
{{- define "kimik3-operator.labelList" -}}
{{- $pairs := list -}}
{{- range $key, $value := . -}}
{{- $pairs = append $pairs (printf "%s=%s" $key $value) -}}
{{- end -}}
{{- join "," $pairs -}}
{{- end }}

{{/* The ClusterRole each endpoint picker of spec.routing is bound to, in its namespace. */}}
{{- define "kimik3-operator.endpointPickerRole" -}}
{{ include "kimik3-operator.fullname" . }}-endpoint-picker
{{- end -}}
