#!/bin/sh
# Copy the service's alert rules and Grafana dashboard into the chart.
# The chart can only package files under its own directory; tests/helm
# fails while the copies differ from the originals.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
chart="$root/helm/rocketmq-tiered"
mkdir -p "$chart/files/dashboards"
cp "$root/metrics/alerts.yaml" "$chart/files/alerts.yaml"
cp "$root/metrics/dashboards/tiered.json" "$chart/files/dashboards/tiered.json"
echo "synced metrics/alerts.yaml and metrics/dashboards/tiered.json into $chart/files/"
