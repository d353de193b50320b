{{/*
The broker ConfigMap's data (broker.conf and run-broker.sh). The pod
template's checksum/broker-config hashes this alone, never the ConfigMap's
labels: those carry the chart version, and a chart upgrade must not restart
every broker.
*/}}
{{- define "rocketmq-tiered.brokerConfigData" -}}
# brokerName and brokerIP1 are appended per pod by run-broker.sh.
broker.conf: |
  brokerClusterName={{ .Values.cluster }}
  brokerId=0
  brokerRole={{ .Values.broker.role }}
  namesrvAddr={{ required "broker.namesrvAddr is required when broker.enabled=true" .Values.broker.namesrvAddr }}
  storePathRootDir={{ .Values.store.mountPath }}
  {{- with .Values.broker.config }}
  {{- . | trim | nindent 2 }}
  {{- end }}
run-broker.sh: |
  #!/bin/sh
  set -eu
  conf=/tmp/broker.conf
  cat /etc/rocketmq/broker.conf > "$conf"
  printf '\nbrokerName=%s\nbrokerIP1=%s\n' "$POD_NAME" "$POD_IP" >> "$conf"

  # mqbroker starts the JVM as a grandchild of this shell, and PID 1
  # ignores SIGTERM it does not handle: forward SIGTERM to the JVM and
  # wait until it has stopped, so the broker shuts down cleanly (flushes,
  # no abort file, no store recovery on the next start).
  stop() {
    for p in /proc/[0-9]*; do
      case "$(readlink "$p/exe" 2>/dev/null || true)" in
        */java) kill -TERM "${p#/proc/}" 2>/dev/null || true ;;
      esac
    done
  }
  trap stop TERM INT

  "$ROCKETMQ_HOME/bin/mqbroker" -c "$conf" &
  child=$!
  status=0
  wait "$child" || status=$?
  # A trapped signal interrupts wait: keep waiting until mqbroker is gone.
  while kill -0 "$child" 2>/dev/null; do
    status=0
    wait "$child" || status=$?
  done
  exit "$status"
{{- end }}
