// The Node example of clients/README.md runs as written (against the real server).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import { clientsDir, reflexCommand } from './helpers.js';

test('README example', async () => {
  const readme = fs.readFileSync(path.join(clientsDir, 'README.md'), 'utf8');
  let code = readme.match(/```js\n([\s\S]*?)```/)[1];
  const { command, args } = reflexCommand();
  code = code.replace("'./clients/node/index.js'", JSON.stringify(pathToFileURL(path.join(clientsDir, 'node', 'index.js')).href))
    .replace("{ command: 'reflex', args: ['stdio'] }", JSON.stringify({ command, args }));
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'reflex-readme-'));
  const file = path.join(dir, 'example.mjs');
  fs.writeFileSync(file, code);
  try {
    const stdout = await new Promise((resolve, reject) => {
      execFile(process.execPath, [file], { timeout: 120000 }, (err, out, errOut) => (err ? reject(new Error(`${err.message}\n${errOut}`)) : resolve(out)));
    });
    const lines = stdout.trim().split('\n');
    assert.ok(lines.length >= 3 && lines.at(-1).trim() === 'Paris', stdout);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
