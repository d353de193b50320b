{{/*
=============================================================================
Attach-mode API: named templates that put the tiered sidecar into a broker
pod. This chart's own broker StatefulSet (sidecar mode) uses them too, so
both modes run the same container.

From a broker chart that depends on this one (alias `tiered`), call them
with this chart's values and your release:

  {{- $tiered := dict "Values" .Values.tiered "Release" .Release }}
  template:
    metadata:
      annotations:
        {{- include "rocketmq-tiered.podAnnotations" $tiered | nindent 8 }}
    spec:
      serviceAccountName: {{ include "rocketmq-tiered.serviceAccountName" $tiered }}
      containers:
        - name: broker
          ...
        {{- include "rocketmq-tiered.sidecar" $tiered | nindent 8 }}
      volumes:
        {{- include "rocketmq-tiered.volumes" $tiered | nindent 8 }}

  rocketmq-tiered.sidecar         the `tiered` container (a list item)
  rocketmq-tiered.volumes         its config, state and /tmp volumes (list items)
  rocketmq-tiered.podAnnotations  checksum of the config: pods roll when it changes
  rocketmq-tiered.config          the config file itself (YAML)

The store volume (store.volumeName) is yours: the sidecar only mounts it,
read-only, at store.mountPath. See README.md for the pod-level settings
(fsGroup, terminationGracePeriodSeconds) the sidecar relies on.
=============================================================================
*/}}

{{/*
The tiered config file, built as a dict and serialised with toYaml so that
no value can break the YAML. Keys are those of tiered's Settings; unknown
keys are rejected by tiered at start-up, so a typo here fails loudly.
Credentials are never part of it (see rocketmq-tiered.credentialsEnv).
*/}}
{{- define "rocketmq-tiered.config" -}}
{{- $v := .Values }}
{{- $s3 := dict
      "addressing" $v.s3.addressing
      "sse" $v.s3.sse
      "checksum_mode" $v.s3.checksumMode
      "max_attempts" $v.s3.maxAttempts
      "connect_timeout" $v.s3.connectTimeout
      "read_timeout" $v.s3.readTimeout }}
{{- with $v.s3.endpoint }}{{ $_ := set $s3 "endpoint_url" . }}{{ end }}
{{- with $v.s3.region }}{{ $_ := set $s3 "region" . }}{{ end }}
{{- with $v.s3.sseKmsKeyId }}{{ $_ := set $s3 "sse_kms_key_id" . }}{{ end }}
{{- $dispatch := dict
      "interval" $v.dispatch.interval
      "upload_bytes" $v.dispatch.uploadBytes
      "max_delay" $v.dispatch.maxDelay
      "segment_bytes" $v.dispatch.segmentBytes
      "start_position" $v.dispatch.startPosition
      "parallelism" $v.dispatch.parallelism
      "round_budget" $v.dispatch.roundBudget
      "quarantine_corrupt" $v.dispatch.quarantineCorrupt
      "key_index" $v.dispatch.keyIndex }}
{{- $cleaner := dict
      "enabled" $v.cleaner.enabled
      "interval" $v.cleaner.interval
      "orphan_grace" $v.cleaner.orphanGrace
      "skew_tolerance" $v.cleaner.skewTolerance
      "merge" $v.cleaner.merge
      "merge_target_bytes" $v.cleaner.mergeTargetBytes
      "merge_min_bytes" $v.cleaner.mergeMinBytes }}
{{- $config := dict
      "store" $v.store.mountPath
      "cold_url" $v.cold.url
      "state_dir" "/var/lib/tiered/state"
      "cluster" $v.cluster
      "lease_ttl" $v.leaseTtl
      "shutdown_timeout" $v.shutdownTimeoutSeconds
      "s3" $s3
      "dispatch" $dispatch
      "cleaner" $cleaner
      "retention" (dict "default_hours" $v.retention.defaultHours "topics" $v.retention.topics)
      "topics" (dict "include" $v.topics.include "exclude" $v.topics.exclude "include_system" $v.topics.includeSystem)
      "metrics" (dict "host" "0.0.0.0" "port" $v.metrics.port "per_queue" $v.metrics.perQueue)
      "log" (dict "format" $v.log.format "level" $v.log.level) }}
{{- with $v.brokerName }}{{ $_ := set $config "broker" . }}{{ end }}
{{- toYaml $config }}
{{- end }}

{{- define "rocketmq-tiered.podAnnotations" -}}
checksum/tiered-config: {{ include "rocketmq-tiered.config" . | sha256sum }}
{{- end }}

{{- define "rocketmq-tiered.sidecarEnv" -}}
{{- if not .Values.brokerName }}
# Archive under the pod's own name: each broker pod is one broker.
- name: TIERED_BROKER
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
{{- end }}
{{- include "rocketmq-tiered.credentialsEnv" . }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "rocketmq-tiered.sidecar" -}}
- name: tiered
  image: {{ include "rocketmq-tiered.imageRef" .Values.image | quote }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  command: ["tiered", "serve"]
  args: ["--config", "/etc/tiered/config.yaml"]
  {{- with (include "rocketmq-tiered.sidecarEnv" . | trim) }}
  env:
    {{- . | nindent 4 }}
  {{- end }}
  ports:
    - name: tiered-metrics
      containerPort: {{ .Values.metrics.port }}
      protocol: TCP
  # No readinessProbe, on purpose: Kubernetes takes the whole pod (the
  # broker) out of its Services while any container is not ready, and S3
  # trouble, a lease held elsewhere or a bad store must never do that. They
  # are metrics and alerts instead. /healthz is liveness only: the
  # scheduler loop is alive (never S3, the lease or the store).
  startupProbe:
    httpGet:
      path: /healthz
      port: tiered-metrics
    {{- toYaml .Values.probes.startup | nindent 4 }}
  livenessProbe:
    httpGet:
      path: /healthz
      port: tiered-metrics
    {{- toYaml .Values.probes.liveness | nindent 4 }}
  resources:
    {{- toYaml .Values.resources | nindent 4 }}
  securityContext:
    {{- toYaml .Values.securityContext | nindent 4 }}
  volumeMounts:
    # The broker's store: read-only, tiered never writes to it.
    - name: {{ .Values.store.volumeName }}
      mountPath: {{ .Values.store.mountPath }}
      {{- with .Values.store.subPath }}
      subPath: {{ . }}
      {{- end }}
      readOnly: true
    - name: tiered-config
      mountPath: /etc/tiered
      readOnly: true
    - name: tiered-state
      mountPath: /var/lib/tiered
    - name: tiered-tmp
      mountPath: /tmp
    {{- with .Values.extraVolumeMounts }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end }}

{{- define "rocketmq-tiered.volumes" -}}
- name: tiered-config
  configMap:
    name: {{ include "rocketmq-tiered.configName" . }}
- name: tiered-state
  emptyDir:
    {{- with .Values.state.medium }}
    medium: {{ . }}
    {{- end }}
    sizeLimit: {{ .Values.state.sizeLimit }}
- name: tiered-tmp
  emptyDir:
    sizeLimit: {{ .Values.tmpSizeLimit }}
{{- with .Values.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end }}
