#!/bin/sh
# Helm post-renderer: reads the community RocketMQ chart's rendered
# manifests on stdin and writes them with the tiered sidecar added to every
# master broker StatefulSet (kustomization.yaml + tiered-sidecar.yaml).
#
#   helm template rocketmq <community chart> -n rocketmq \
#     | helm/attach/community-chart/post-render.sh | kubectl apply -n rocketmq -f -
#   helm install rocketmq <community chart> -n rocketmq \
#     --post-renderer helm/attach/community-chart/post-render.sh     # Helm 3
#
# Needs kustomize or kubectl (which embeds it) on PATH. Works in a temporary
# directory: kustomize reads only files at or below its kustomization.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
trap 'exit 1' INT TERM
cp "$here/kustomization.yaml" "$here/tiered-sidecar.yaml" "$work/"
cat > "$work/helm-output.yaml"
if command -v kustomize > /dev/null 2>&1; then
  kustomize build "$work"
elif command -v kubectl > /dev/null 2>&1; then
  kubectl kustomize "$work"
else
  echo "post-render.sh: needs kustomize or kubectl on PATH" >&2
  exit 127
fi
