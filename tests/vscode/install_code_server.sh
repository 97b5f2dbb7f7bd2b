#!/usr/bin/env bash
# Install code-server (a real VS Code in the browser) from the npm registry into DIR, for
# tests/vscode/test_code_server.py; about 3 minutes on 2 cores. Node 20 here (Debian), so
# code-server 4.100.3, the last release whose package.json asks for node 20. Its postinstall
# fetches ripgrep from GitHub releases, which this machine cannot reach: the steps below run
# the same postinstall by hand with Debian's rg in its place. Needs (apt): build-essential
# python3 libkrb5-dev ripgrep.
# Then: MSMON_CODE_SERVER=DIR/node_modules/.bin/code-server pytest tests/vscode/test_code_server.py
set -euo pipefail
dir=${1:?usage: install_code_server.sh DIR}
version=4.100.3
mkdir -p "$dir" && cd "$dir"
export npm_config_yes=true  # node-pty's post-install runs `npx node-gyp`
npm install --no-audit --no-fund --ignore-scripts "code-server@$version"
npm rebuild argon2
cd node_modules/code-server/lib/vscode
npm install --omit=dev --ignore-scripts --no-audit --no-fund
mkdir -p node_modules/@vscode/ripgrep/bin
cp "$(command -v rg)" node_modules/@vscode/ripgrep/bin/rg  # its postinstall skips an existing bin/
npm rebuild  # native modules: node-pty, @parcel/watcher, kerberos, spdlog, ...
# the rest of code-server's postinstall.sh (vscode_install)
ln -sfn node_modules node_modules.asar
(cd bin/remote-cli && ln -sfn code-linux.sh code-server)
(cd bin/helpers && ln -sfn browser-linux.sh browser.sh)
(cd extensions && npm install --omit=dev --no-audit --no-fund)
echo "installed: $dir/node_modules/.bin/code-server ($("$dir/node_modules/.bin/code-server" --version | head -1))"
