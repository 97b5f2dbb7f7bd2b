// Stands in for the two things msmon's VS Code presets use from Microsoft's Python
// extensions, which come from marketplaces this machine cannot reach:
// - the command python.interpreterPath (ms-python.python): python.defaultInterpreterPath
//   from the project's settings, as `msmon vscode init` writes it;
// - the "debugpy" debug type (ms-python.debugpy): like that extension, it runs the debugpy
//   package's own debug adapter (`python -m debugpy.adapter`, from the project's
//   interpreter) and passes that interpreter as the launch configuration's "python".
// package.json declares what those extensions declare for the presets' schemas, copied
// verbatim from their own package.json: the debugpy debug type's configurationAttributes
// (microsoft/vscode-python-debugger accf6836) and the settings the presets set
// (microsoft/vscode-python 757def8f, microsoft/vscode-jupyter 3d24702e), so VS Code validates
// launch.json and settings.json as it would with the real extensions installed.
// With MSMON_STUB_DIAGNOSTICS set, every diagnostic VS Code holds (its markers: JSON schema
// warnings, settings hints, task problem matchers' problems) is written there as JSON on each
// change: the tests read what the Problems view lists.
const vscode = require("vscode");

function interpreter(folder) {
  folder = folder || vscode.workspace.workspaceFolders[0];
  const value = vscode.workspace.getConfiguration("python", folder.uri).get("defaultInterpreterPath");
  return value.replace("${workspaceFolder}", folder.uri.fsPath);
}

exports.activate = (context) => {
  // the tests wait for this file rather than guess when the extension host is up
  if (process.env.MSMON_STUB_READY) require("fs").writeFileSync(process.env.MSMON_STUB_READY, "ok");
  const out = process.env.MSMON_STUB_DIAGNOSTICS;
  if (out) {
    const dump = () => {
      const all = vscode.languages.getDiagnostics().map(([uri, list]) => ({
        path: uri.fsPath,
        diagnostics: list.map((d) => ({
          severity: vscode.DiagnosticSeverity[d.severity],
          message: d.message,
          source: d.source || "",
          line: d.range.start.line,
        })),
      }));
      require("fs").writeFileSync(out + ".tmp", JSON.stringify(all));
      require("fs").renameSync(out + ".tmp", out); // never read half-written
    };
    context.subscriptions.push(vscode.languages.onDidChangeDiagnostics(dump));
    dump();
  }
  context.subscriptions.push(
    vscode.commands.registerCommand("python.interpreterPath", () => interpreter()),
    vscode.debug.registerDebugConfigurationProvider("debugpy", {
      resolveDebugConfiguration(folder, config) {
        if (!config.python) config.python = interpreter(folder);
        return config;
      },
    }),
    vscode.debug.registerDebugAdapterDescriptorFactory("debugpy", {
      createDebugAdapterDescriptor(session) {
        return new vscode.DebugAdapterExecutable(interpreter(session.workspaceFolder), [
          "-m",
          "debugpy.adapter",
        ]);
      },
    }),
  );
};
