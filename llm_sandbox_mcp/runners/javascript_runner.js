// Runs inside the sandbox as `node -e <this file>`: the user's code arrives on stdin.
// ES module syntax (import/export, top-level await, import.meta) runs as /workspace/main.mjs, anything
// else as CommonJS /workspace/main.js, through Node's own entry point so that require.main, import.meta.url,
// stack traces and exit codes are those of `node main.js`. Installed npm packages are linked in as
// /workspace/node_modules, where both require() and import look. Prints nothing of its own.
'use strict';
const fs = require('fs');
const vm = require('vm');

const LIBS = '/opt/llm-sandbox/libs/node/node_modules';
// The errors V8 gives module-only syntax when parsed as a CommonJS function body (as Node's own
// --experimental-detect-module decides).
const MODULE_ONLY = new RegExp(
  [
    'Cannot use import statement outside a module',
    "Unexpected token 'export'",
    "Cannot use 'import\\.meta' outside a module",
    'await is only valid in async functions and the top level bodies of modules',
    'for await is only valid in async functions',
  ].join('|'),
);

function isModule(source) {
  try {
    vm.compileFunction(source, ['exports', 'require', 'module', '__filename', '__dirname']);
    return false;
  } catch (error) {
    return error instanceof SyntaxError && MODULE_ONLY.test(error.message);
  }
}

const source = fs.readFileSync(0, 'utf8');
const file = isModule(source) ? '/workspace/main.mjs' : '/workspace/main.js';
fs.writeFileSync(file, source);
if (fs.existsSync(LIBS) && !fs.existsSync('/workspace/node_modules')) {
  fs.symlinkSync(LIBS, '/workspace/node_modules', 'dir');
}
process.argv = [process.execPath, file];
// From a fresh tick, so that no frame of this runner shows in the user's stack traces.
setImmediate(require('module').runMain);
