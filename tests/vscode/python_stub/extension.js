// Stands in for the two things msmon's VS Code presets use from Microsoft's Python
// extensions, which come from marketplaces this machine cannot reach:
// - the command python.interpreterPath (ms-python.python): python.defaultInterpreterPath
//   from the project's settings, as `msmon vscode init` writes it;
// - the "debugpy" debug type (ms-python.debugpy): like that extension, it runs the debugpy
//   package's own debug adapter (`python -m debugpy.adapter`, from the project's
//   interpreter) and passes that interpreter as the launch configuration's "python".
const vscode = require("vscode");

function interpreter(folder) {
  folder = folder || vscode.workspace.workspaceFolders[0];
  const value = vscode.workspace.getConfiguration("python", folder.uri).get("defaultInterpreterPath");
  return value.replace("${workspaceFolder}", folder.uri.fsPath);
}

exports.activate = (context) => {
  // the tests wait for this file rather than guess when the extension host is up
  if (process.env.MSMON_STUB_READY) require("fs").writeFileSync(process.env.MSMON_STUB_READY, "ok");
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
