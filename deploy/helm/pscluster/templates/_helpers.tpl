{{/* Names and labels shared by every object of the chart. */}}
{{- define "pscluster.fullname" -}}
{{- printf "%s-pscluster" .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}

{{- define "pscluster.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* GPU workers run the GPU image (deploy/Dockerfile, --target gpu). */}}
{{- define "pscluster.gpuImage" -}}
{{- printf "%s:%s" .Values.image.gpuRepository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "pscluster.labels" -}}
app.kubernetes.io/name: pscluster
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: pscluster
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "pscluster.selector" -}}
app.kubernetes.io/name: pscluster
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "pscluster.schedulerAddress" -}}
{{- printf "%s-scheduler:%d" (include "pscluster.fullname" .) (int .Values.scheduler.port) -}}
{{- end -}}
