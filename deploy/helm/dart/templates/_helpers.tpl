{{/*
The name of the DaemonSet and the headless Service (the Service's DNS name is what the nodes
resolve): fullnameOverride, else the release name when it contains the chart's name, else
<release>-<chart>.
*/}}
{{- define "dart.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
