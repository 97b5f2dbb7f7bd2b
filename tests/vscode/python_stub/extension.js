const vscode = require("vscode");
exports.activate = (context) => {
  context.subscriptions.push(vscode.commands.registerCommand("python.interpreterPath", () => {
    const folder = vscode.workspace.workspaceFolders[0];
    const value = vscode.workspace.getConfiguration("python", folder.uri).get("defaultInterpreterPath");
    return value.replace("${workspaceFolder}", folder.uri.fsPath);
  }));
};
