#!/usr/bin/env bash
# Build the page of tests/vscode/test_webview.py into dist/ from the npm registry (no CDN):
# @jupyterlab/services bundled with esbuild into page.js, requireJS, and the widget-manager
# bundle VS Code's notebook renderer loads, @vscode/jupyter-ipywidgets8 (one self-contained
# file; its 350 MB of npm dependencies are compiled into it, so it is fetched alone with
# `npm pack` and checked against the integrity pinned here). About 15 s on a fresh
# machine; a no-op when nothing it builds from changed. Needs node and npm.
set -euo pipefail
cd "$(dirname "$0")"
widgets_version=1.0.9
widgets_integrity=sha512-bocCThfa4JDIDd7qCFAfW3HpzHfTLYxOTpTbiDfw4DXOUjKHnr6ObkMBiIkuzYPRybh5bY4FhYLemuDuTvIbpQ==
inputs=$(cat build.sh package.json package-lock.json index.html src/*.js | sha256sum | cut -d' ' -f1)
if [ -f dist/.inputs ] && [ "$(cat dist/.inputs)" = "$inputs" ]; then
    exit 0
fi
npm ci --no-audit --no-fund --loglevel=error
rm -rf dist && mkdir -p dist
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
npm pack --silent --pack-destination "$tmp" "@vscode/jupyter-ipywidgets8@$widgets_version" >/dev/null
tgz=("$tmp"/*.tgz)
got="sha512-$(openssl dgst -sha512 -binary "${tgz[0]}" | base64 -w0)"
if [ "$got" != "$widgets_integrity" ]; then
    echo "build.sh: @vscode/jupyter-ipywidgets8@$widgets_version integrity $got, expected $widgets_integrity" >&2
    exit 1
fi
tar -xzf "${tgz[0]}" -C "$tmp" package/dist/ipywidgets.js
cp "$tmp/package/dist/ipywidgets.js" dist/ipywidgets.js
cp node_modules/requirejs/require.js index.html dist/
node_modules/.bin/esbuild src/page.js --bundle --format=esm --platform=browser \
    --target=es2022 --log-level=warning --outfile=dist/page.js
echo "$inputs" > dist/.inputs
echo "built $(pwd)/dist: $(ls dist | tr '\n' ' ')"
