{{/*
Helpers used by this chart's own templates. The attach-mode API (templates
a broker chart includes) lives in _attach.tpl.

Names never depend on .Chart, so that they come out the same when a parent
chart calls the attach templates with (dict "Values" .Values.tiered
"Release" .Release), where .Chart would be the parent's.
*/}}

{{- define "rocketmq-tiered.name" -}}
{{- default "rocketmq-tiered" .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "rocketmq-tiered.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := include "rocketmq-tiered.name" . }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Name of the object carrying the tiered config. */}}
{{- define "rocketmq-tiered.configName" -}}
{{- printf "%s-config" (include "rocketmq-tiered.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Name of the broker StatefulSet, its headless Service and broker.conf. */}}
{{- define "rocketmq-tiered.brokerName" -}}
{{- printf "%s-broker" (include "rocketmq-tiered.fullname" .) | trunc 52 | trimSuffix "-" }}
{{- end }}

{{- define "rocketmq-tiered.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels that never change over a release's life (used in selectors). */}}
{{- define "rocketmq-tiered.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rocketmq-tiered.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Standard labels of every object the chart creates. */}}
{{- define "rocketmq-tiered.labels" -}}
helm.sh/chart: {{ include "rocketmq-tiered.chart" . }}
{{ include "rocketmq-tiered.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: rocketmq
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
Labels of the pods the chart creates: no chart or app version, so that a
chart upgrade alone does not restart every broker.
*/}}
{{- define "rocketmq-tiered.podLabels" -}}
{{ include "rocketmq-tiered.selectorLabels" . }}
app.kubernetes.io/part-of: rocketmq
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Selector labels of the broker pods (sidecar mode). */}}
{{- define "rocketmq-tiered.brokerSelectorLabels" -}}
{{ include "rocketmq-tiered.selectorLabels" . }}
app.kubernetes.io/component: broker
{{- end }}

{{/*
The pods that run tiered: the chart's broker pods in sidecar mode, the
user's broker pods (attach.podSelector) in attach mode. Empty when unknown.
*/}}
{{- define "rocketmq-tiered.tieredPodSelector" -}}
{{- if .Values.broker.enabled }}
{{- include "rocketmq-tiered.brokerSelectorLabels" . }}
{{- else if .Values.attach.podSelector }}
{{- toYaml .Values.attach.podSelector }}
{{- end }}
{{- end }}

{{- define "rocketmq-tiered.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "rocketmq-tiered.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* repository[:tag][@digest] from an image dict. */}}
{{- define "rocketmq-tiered.imageRef" -}}
{{- .repository }}
{{- with .tag }}:{{ . }}{{ end }}
{{- with .digest }}@{{ . }}{{ end }}
{{- end }}

{{/*
Credentials: only ever references to an existing Secret, never values.
With no existingSecret the AWS SDK's default chain applies (IRSA web
identity, workload identity, instance profile).
*/}}
{{- define "rocketmq-tiered.credentialsEnv" -}}
{{- with .Values.s3.existingSecret }}
- name: AWS_ACCESS_KEY_ID
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: {{ $.Values.s3.existingSecretKeys.accessKeyId }}
- name: AWS_SECRET_ACCESS_KEY
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: {{ $.Values.s3.existingSecretKeys.secretAccessKey }}
{{- end }}
{{- end }}

{{/* Pod grace period must outlast tiered's own graceful stop. */}}
{{- define "rocketmq-tiered.terminationGracePeriodSeconds" -}}
{{- $grace := int .Values.terminationGracePeriodSeconds }}
{{- $stop := int .Values.shutdownTimeoutSeconds }}
{{- if le $grace $stop }}
{{- fail (printf "terminationGracePeriodSeconds (%d) must be greater than shutdownTimeoutSeconds (%d)" $grace $stop) }}
{{- end }}
{{- $grace }}
{{- end }}
