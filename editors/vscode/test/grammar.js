// Tokenizes examples/mnist_cnn.est with the extension's TextMate grammar through
// vscode-textmate (the engine VS Code uses) and checks the scopes of some tokens.
// Run: cd editors/vscode && npm install --no-save vscode-textmate@9.2.0 vscode-oniguruma@2.0.1 && node test/grammar.js
const fs = require("fs");
const path = require("path");
const vsctm = require("vscode-textmate");
const oniguruma = require("vscode-oniguruma");

const wasm = fs.readFileSync(path.join(path.dirname(require.resolve("vscode-oniguruma")), "onig.wasm")).buffer;
const onigLib = oniguruma.loadWASM(wasm).then(() => ({
  createOnigScanner: (p) => new oniguruma.OnigScanner(p),
  createOnigString: (s) => new oniguruma.OnigString(s),
}));
const registry = new vsctm.Registry({
  onigLib,
  loadGrammar: async () =>
    vsctm.parseRawGrammar(fs.readFileSync(path.join(__dirname, "../syntaxes/est.tmLanguage.json"), "utf8"), "est.tmLanguage.json"),
});

registry.loadGrammar("source.est").then((grammar) => {
  const text = fs.readFileSync(path.join(__dirname, "../../../examples/mnist_cnn.est"), "utf8");
  let state = vsctm.INITIAL;
  const seen = new Map();
  for (const line of text.split("\n")) {
    const r = grammar.tokenizeLine(line, state);
    for (const t of r.tokens) {
      const word = line.substring(t.startIndex, t.endIndex);
      if (!seen.has(word)) seen.set(word, t.scopes[t.scopes.length - 1]);
    }
    state = r.ruleStack;
  }
  const want = {
    model: "keyword.declaration.est",
    mnist_cnn: "entity.name.function.est",
    f32: "storage.type.est",
    "|>": "keyword.operator.pipe.est",
    "0.05": "constant.numeric.float.est",
    "128": "constant.numeric.integer.est",
    train: "keyword.other.est",
    if: "keyword.control.est",
    conv2d: "entity.name.function.call.est",
    split: "variable.other.est",
  };
  let bad = 0;
  for (const [w, scope] of Object.entries(want)) {
    const got = seen.get(w);
    if (got !== scope) {
      console.log(`${w}: ${got} (want ${scope})`);
      bad++;
    }
  }
  const comment = [...seen.entries()].find(([w]) => w.startsWith("// the one params"));
  if (!comment || !comment[1].startsWith("comment.line")) {
    console.log("comment not scoped as a comment", comment);
    bad++;
  }
  console.log(bad ? `${bad} scope(s) wrong` : `all ${Object.keys(want).length + 1} scopes right`);
  process.exit(bad ? 1 : 0);
});
