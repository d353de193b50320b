#!/bin/sh
# Helm post-renderer for the community RocketMQ chart 1.x: the chart 12.x
# post-renderer (../community-chart/post-render.sh, which documents it) run
# with this directory's kustomization.yaml and tiered-sidecar.yaml.
set -eu
here=$(cd -P "$(dirname "$0")" && pwd -P)
exec sh "$here/../community-chart/post-render.sh" "$here"
