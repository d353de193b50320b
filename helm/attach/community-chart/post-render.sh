#!/bin/sh
# Helm post-renderer: reads the community RocketMQ chart's rendered
# manifests on stdin and writes them with the tiered sidecar added to the
# master broker StatefulSets (kustomization.yaml + tiered-sidecar.yaml of
# DIR, by default this script's directory: chart 12.x).
#
#   helm template rocketmq <community chart> -n rocketmq \
#     | helm/attach/community-chart/post-render.sh | kubectl apply -n rocketmq -f -
#   helm install rocketmq <community chart> -n rocketmq \
#     --post-renderer helm/attach/community-chart/post-render.sh     # Helm 3
#   helm plugin install helm/attach/community-chart                  # Helm 4:
#   helm install rocketmq <community chart> -n rocketmq --post-renderer tiered-attach-community
#
# Exits 1 with one line on stderr, writing nothing, when no StatefulSet was
# patched (names of another chart version) or when the patched ones do not
# mount the store subPath the patch mounts (it would read an empty
# directory). Needs kustomize or kubectl (which embeds it) on PATH.
set -eu
here=$(cd -P "$(dirname "$0")" && pwd -P)
dir=${1:-$here}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
trap 'exit 1' INT TERM
cp "$dir/kustomization.yaml" "$dir/tiered-sidecar.yaml" "$work/"
cat > "$work/helm-output.yaml"
if command -v kustomize > /dev/null 2>&1; then
  kustomize build "$work" > "$work/out.yaml"
elif command -v kubectl > /dev/null 2>&1; then
  kubectl kustomize "$work" > "$work/out.yaml"
else
  echo "post-render.sh: needs kustomize or kubectl on PATH" >&2
  exit 127
fi
label='rocketmq-tiered/sidecar: ["'"'"']true["'"'"']'
patched=$(( $(grep -c "$label" "$work/out.yaml" || true) - $(grep -c "$label" "$work/helm-output.yaml" || true) ))
name=$(sed -n 's/^ *name: "\(.*\)"$/\1/p' "$dir/kustomization.yaml")
if [ "$patched" -le 0 ]; then
  echo "post-render.sh: patched no StatefulSet: none is named $name (another chart version? see helm/attach/README.md)" >&2
  exit 1
fi
sub=$(sed -n 's/^ *subPath: *//p' "$dir/tiered-sidecar.yaml")
if [ "$(grep -c "^ *subPath: *$sub\$" "$work/helm-output.yaml" || true)" -lt "$patched" ]; then
  echo "post-render.sh: the patched StatefulSets do not mount the store subPath $sub (another chart version? see helm/attach/README.md)" >&2
  exit 1
fi
cat "$work/out.yaml"
