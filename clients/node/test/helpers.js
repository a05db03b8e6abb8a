import { fileURLToPath } from 'node:url';
import path from 'node:path';

const here = path.dirname(fileURLToPath(import.meta.url));
export const clientsDir = path.resolve(here, '..', '..');
export const repoDir = path.resolve(clientsDir, '..');
export const vectorsDir = path.join(repoDir, 'protocol', 'vectors');
// The fake server is used ONLY for fault injection (no ready line, garbage,
// slow answers, a child that dies); everything else runs against the real server.
export const fakeServer = path.join(clientsDir, 'testdata', 'fake_server.py');

/** The command that starts the real server on stdio ($REFLEX_CMD overrides). */
export function reflexCommand() {
  const argv = (process.env.REFLEX_CMD || 'reflex stdio').trim().split(/\s+/);
  return { command: argv[0], args: argv.slice(1) };
}
