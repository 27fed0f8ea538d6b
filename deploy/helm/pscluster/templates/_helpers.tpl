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
{{- if eq .Values.scheduler.etcd.endpoints "" -}}
{{- printf "%s-scheduler:%d" (include "pscluster.fullname" .) (int .Values.scheduler.port) -}}
{{- else -}}
{{- printf "dns:///%s-scheduler-peers:%d" (include "pscluster.fullname" .) (int .Values.scheduler.port) -}}
{{- end -}}
{{- end -}}

{{/* TLS flags of every daemon (tls.*). */}}
{{- define "pscluster.tlsArgs" -}}
{{- if .Values.tls.enabled }}
- --tls_cert=/etc/pscluster/tls/tls.crt
- --tls_key=/etc/pscluster/tls/tls.key
{{- if .Values.tls.mutual }}
- --tls_ca=/etc/pscluster/tls/ca.crt
{{- end }}
{{- end }}
{{- end -}}

{{/* Health probes on gRPC port `port`: gRPC health checks, or TCP checks under TLS. */}}
{{- define "pscluster.probes" -}}
{{- $ctx := index . 0 -}}
{{- $port := index . 1 -}}
livenessProbe:
  {{- if $ctx.Values.tls.enabled }}
  tcpSocket:
    port: {{ $port }}
  {{- else }}
  grpc:
    port: {{ $port }}
  {{- end }}
  initialDelaySeconds: 5
  periodSeconds: 10
readinessProbe:
  {{- if $ctx.Values.tls.enabled }}
  tcpSocket:
    port: {{ $port }}
  {{- else }}
  grpc:
    port: {{ $port }}
  {{- end }}
  periodSeconds: 5
{{- end -}}

{{/* Secret volumes: TLS, and the token file with the credential of daemon kind `kind`. */}}
{{- define "pscluster.secretVolumes" -}}
{{- $ctx := index . 0 -}}
{{- $kind := index . 1 -}}
{{- if $ctx.Values.tls.enabled }}
- name: tls
  secret:
    secretName: {{ $ctx.Values.tls.secretName }}
    defaultMode: 0440
{{- end }}
{{- if $ctx.Values.auth.enabled }}
- name: auth
  secret:
    secretName: {{ $ctx.Values.auth.secretName }}
    defaultMode: 0440
    items:
      - key: tokens
        path: tokens
      - key: {{ $kind }}.token
        path: {{ $kind }}.token
      {{- if and $ctx.Values.auth.quotas (eq $kind "scheduler") }}
      - key: quotas
        path: quotas
      {{- end }}
{{- end }}
{{- end -}}

{{- define "pscluster.secretMounts" -}}
{{- if .Values.tls.enabled }}
- name: tls
  mountPath: /etc/pscluster/tls
  readOnly: true
{{- end }}
{{- if .Values.auth.enabled }}
- name: auth
  mountPath: /etc/pscluster/auth
  readOnly: true
{{- end }}
{{- end -}}

{{/* Token flags of daemon kind `kind` (auth.*). */}}
{{- define "pscluster.authArgs" -}}
{{- $ctx := index . 0 -}}
{{- $kind := index . 1 -}}
{{- if $ctx.Values.auth.enabled }}
- --token_file=/etc/pscluster/auth/tokens
- --credential_file=/etc/pscluster/auth/{{ $kind }}.token
{{- if and $ctx.Values.auth.quotas (eq $kind "scheduler") }}
- --quota_file=/etc/pscluster/auth/quotas
{{- end }}
{{- end }}
{{- end -}}

{{- define "pscluster.checkpointsClaim" -}}
{{- default (printf "%s-checkpoints" (include "pscluster.fullname" .)) .Values.storage.sharedCheckpoints.existingClaim -}}
{{- end -}}

{{- define "pscluster.exportsClaim" -}}
{{- default (printf "%s-exports" (include "pscluster.fullname" .)) .Values.storage.exports.existingClaim -}}
{{- end -}}
