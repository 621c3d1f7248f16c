// Starts `estc lsp` for .est files and passes it the target and the mode of the inlay
// hints from the settings (`est.target`, `est.mode`; changes are sent as
// workspace/didChangeConfiguration). Inlay hints, semantic tokens, rename, quick fixes,
// signature help and formatting come with the language client.
const vscode = require("vscode");
const { LanguageClient, TransportKind } = require("vscode-languageclient/node");

let client;

function activate(context) {
  const config = vscode.workspace.getConfiguration("est");
  const command = config.get("path", "estc");
  const serverOptions = {
    run: { command, args: ["lsp"], transport: TransportKind.stdio },
    debug: { command, args: ["lsp"], transport: TransportKind.stdio },
  };
  const clientOptions = {
    documentSelector: [{ scheme: "file", language: "est" }],
    initializationOptions: {
      target: config.get("target", "wafer"),
      mode: config.get("mode", "train"),
    },
    synchronize: { configurationSection: "est" },
  };
  client = new LanguageClient("est", "est language server", serverOptions, clientOptions);
  context.subscriptions.push(client);
  return client.start();
}

function deactivate() {
  return client ? client.stop() : undefined;
}

module.exports = { activate, deactivate };
